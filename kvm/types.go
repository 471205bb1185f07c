package kvm

// Regs mirrors struct kvm_regs (arch/x86/include/uapi/asm/kvm.h).
type Regs struct {
	RAX, RBX, RCX, RDX, RSI, RDI, RSP, RBP uint64
	R8, R9, R10, R11, R12, R13, R14, R15   uint64
	RIP, RFLAGS                            uint64
}

// Segment mirrors struct kvm_segment.
type Segment struct {
	Base     uint64
	Limit    uint32
	Selector uint16
	Type     uint8
	Present  uint8
	DPL      uint8
	DB       uint8
	S        uint8
	L        uint8
	G        uint8
	AVL      uint8
	Unusable uint8
	_        uint8
}

// DTable mirrors struct kvm_dtable (a GDTR or IDTR).
type DTable struct {
	Base  uint64
	Limit uint16
	_     [3]uint16
}

// Sregs mirrors struct kvm_sregs.
type Sregs struct {
	CS, DS, ES, FS, GS, SS Segment
	TR, LDT                Segment
	GDT, IDT               DTable
	CR0, CR2, CR3, CR4     uint64
	CR8                    uint64
	EFER                   uint64
	APICBase               uint64
	InterruptBitmap        [4]uint64
}

// FPU mirrors struct kvm_fpu.
type FPU struct {
	FPR        [8][16]uint8
	FCW        uint16
	FSW        uint16
	FTWX       uint8
	_          uint8
	LastOpcode uint16
	LastIP     uint64
	LastDP     uint64
	XMM        [16][16]uint8
	MXCSR      uint32
	_          uint32
}

// LAPICState mirrors struct kvm_lapic_state: the local APIC register page.
type LAPICState struct {
	Regs [1024]byte
}

// MSR is one struct kvm_msr_entry.
type MSR struct {
	Index uint32
	_     uint32
	Data  uint64
}

// CPUIDEntry mirrors struct kvm_cpuid_entry2.
type CPUIDEntry struct {
	Function uint32
	Index    uint32
	Flags    uint32
	EAX      uint32
	EBX      uint32
	ECX      uint32
	EDX      uint32
	_        [3]uint32
}

// userspaceMemoryRegion mirrors struct kvm_userspace_memory_region.
type userspaceMemoryRegion struct {
	Slot          uint32
	Flags         uint32
	GuestPhysAddr uint64
	MemorySize    uint64
	UserspaceAddr uint64
}

// irqfd mirrors struct kvm_irqfd.
type irqfd struct {
	FD         uint32
	GSI        uint32
	Flags      uint32
	ResampleFD uint32
	_          [16]uint8
}

// ioeventfd mirrors struct kvm_ioeventfd.
type ioeventfd struct {
	Datamatch uint64
	Addr      uint64
	Len       uint32
	FD        int32
	Flags     uint32
	_         [36]uint8
}

// pitConfig mirrors struct kvm_pit_config.
type pitConfig struct {
	Flags uint32
	_     [15]uint32
}

// irqLevel mirrors struct kvm_irq_level.
type irqLevel struct {
	IRQ   uint32
	Level uint32
}

// mpState mirrors struct kvm_mp_state.
type mpState struct {
	State uint32
}

// Offsets into struct kvm_run (include/uapi/linux/kvm.h). The page is read
// through encoding/binary at these offsets rather than overlaid with a Go
// struct, because its exit-specific part is a union.
const (
	runImmediateExit = 1  // __u8 immediate_exit
	runExitReason    = 8  // __u32 exit_reason
	runExit          = 32 // start of the exit union

	// io
	runIODirection  = runExit + 0 // __u8 direction (0 in, 1 out)
	runIOSize       = runExit + 1 // __u8 size
	runIOPort       = runExit + 2 // __u16 port
	runIOCount      = runExit + 4 // __u32 count
	runIODataOffset = runExit + 8 // __u64 data_offset

	// mmio
	runMMIOPhysAddr = runExit + 0  // __u64 phys_addr
	runMMIOData     = runExit + 8  // __u8 data[8]
	runMMIOLen      = runExit + 16 // __u32 len
	runMMIOIsWrite  = runExit + 20 // __u8 is_write

	// system_event, internal, fail_entry
	runSystemEventType = runExit + 0 // __u32 type
	runInternalSuberr  = runExit + 0 // __u32 suberror
	runInternalNData   = runExit + 4 // __u32 ndata
	runInternalData    = runExit + 8 // __u64 data[16]
	runFailEntryReason = runExit + 0 // __u64 hardware_exit_reason

	runMinSize = 256 // the union is padded to 256 bytes
)

// maxCPUIDEntries bounds the CPUID table exchanged with KVM.
const maxCPUIDEntries = 256

// cpuid2 mirrors struct kvm_cpuid2 with room for maxCPUIDEntries entries.
type cpuid2 struct {
	Nent    uint32
	_       uint32
	Entries [maxCPUIDEntries]CPUIDEntry
}

// maxMSRs bounds one KVM_GET_MSRS/KVM_SET_MSRS batch.
const maxMSRs = 64

// msrs mirrors struct kvm_msrs with room for maxMSRs entries.
type msrs struct {
	NMSRs   uint32
	_       uint32
	Entries [maxMSRs]MSR
}

// enableCap mirrors struct kvm_enable_cap.
type enableCap struct {
	Cap   uint32
	Flags uint32
	Args  [4]uint64
	_     [64]uint8
}

// irqRoutingEntry mirrors struct kvm_irq_routing_entry with its union
// spelled as the MSI member (type KVM_IRQ_ROUTING_MSI), the only one used.
type irqRoutingEntry struct {
	GSI    uint32
	Type   uint32
	Flags  uint32
	_      uint32
	AddrLo uint32
	AddrHi uint32
	Data   uint32
	DevID  uint32
	_      [4]uint32 // rest of the 32-byte union
}

// maxRoutes bounds one KVM_SET_GSI_ROUTING table.
const maxRoutes = 64

// irqRouting mirrors struct kvm_irq_routing with room for maxRoutes entries.
type irqRouting struct {
	Nr      uint32
	Flags   uint32
	Entries [maxRoutes]irqRoutingEntry
}

// kvmMSI mirrors struct kvm_msi.
type kvmMSI struct {
	AddrLo uint32
	AddrHi uint32
	Data   uint32
	Flags  uint32
	DevID  uint32
	_      [12]uint8
}

const irqRoutingTypeMSI = 2 // KVM_IRQ_ROUTING_MSI

// XSAVE mirrors struct kvm_xsave: the vCPU's XSAVE area as the XSAVE
// instruction lays it out (x87 and SSE in the first 512 bytes, the XSAVE
// header at 512, the extended components after it). It holds everything
// FPU does and more (AVX, AVX-512, PKRU), within 4096 bytes unless the VMM
// has been granted dynamic features such as AMX (see VCPU.XSAVE).
type XSAVE struct {
	Region [1024]uint32
}

// XSTATEBV returns XSTATE_BV from the XSAVE header: which state components
// the area holds (bit 0 x87, bit 1 SSE, bit 2 AVX, ...).
func (x *XSAVE) XSTATEBV() uint64 {
	return uint64(x.Region[128]) | uint64(x.Region[129])<<32
}

// maxXCRs is KVM_MAX_XCRS, the room in struct kvm_xcrs.
const maxXCRs = 16

// XCR mirrors struct kvm_xcr: one extended control register.
type XCR struct {
	XCR   uint32 // register number (0: XCR0, the enabled XSAVE features)
	_     uint32
	Value uint64
}

// XCRs mirrors struct kvm_xcrs: the vCPU's extended control registers.
type XCRs struct {
	NrXCRs uint32 // entries of XCRs in use
	Flags  uint32
	XCRs   [maxXCRs]XCR
	_      [16]uint64
}

// ExceptionEvent mirrors the exception member of struct kvm_vcpu_events.
type ExceptionEvent struct {
	Injected     uint8
	Nr           uint8
	HasErrorCode uint8
	Pending      uint8
	ErrorCode    uint32
}

// InterruptEvent mirrors the interrupt member of struct kvm_vcpu_events.
type InterruptEvent struct {
	Injected uint8
	Nr       uint8
	Soft     uint8
	Shadow   uint8 // interrupt shadow (MOV SS / STI blocking)
}

// NMIEvent mirrors the nmi member of struct kvm_vcpu_events.
type NMIEvent struct {
	Injected uint8
	Pending  uint8
	Masked   uint8
	_        uint8
}

// SMIEvent mirrors the smi member of struct kvm_vcpu_events.
type SMIEvent struct {
	SMM          uint8
	Pending      uint8
	SMMInsideNMI uint8
	LatchedInit  uint8
}

// TripleFaultEvent mirrors the triple_fault member of struct kvm_vcpu_events.
type TripleFaultEvent struct {
	Pending uint8
}

// VCPUEvents mirrors struct kvm_vcpu_events: exceptions, interrupts, NMIs
// and SMIs that are pending or being injected, and the interrupt shadow.
// Flags (VCPUEventValid*) say which of the optional members are meaningful;
// KVM_GET_VCPU_EVENTS sets the ones it filled in, and KVM_SET_VCPU_EVENTS
// applies only those.
type VCPUEvents struct {
	Exception           ExceptionEvent
	Interrupt           InterruptEvent
	NMI                 NMIEvent
	SIPIVector          uint32
	Flags               uint32
	SMI                 SMIEvent
	TripleFault         TripleFaultEvent
	_                   [26]uint8
	ExceptionHasPayload uint8
	ExceptionPayload    uint64
}

// DebugRegs mirrors struct kvm_debugregs: DR0-DR3, DR6 and DR7.
type DebugRegs struct {
	DB    [4]uint64
	DR6   uint64
	DR7   uint64
	Flags uint64 // must be 0 for KVM_SET_DEBUGREGS
	_     [9]uint64
}

// ClockData mirrors struct kvm_clock_data: the VM's kvmclock, in ns.
type ClockData struct {
	Clock    uint64
	Flags    uint32 // Clock* flags: which of the other fields are valid
	_        uint32
	Realtime uint64 // CLOCK_REALTIME when Clock was read (ClockRealtime)
	HostTSC  uint64 // the host TSC when Clock was read (ClockHostTSC)
	_        [4]uint32
}

// IRQChip mirrors struct kvm_irqchip: the state of one in-kernel interrupt
// controller, named by ChipID (IRQChipPICMaster, IRQChipPICSlave or
// IRQChipIOAPIC). Chip is the kernel's union, kept as raw bytes; PIC and
// IOAPIC decode it.
type IRQChip struct {
	ChipID uint32
	_      uint32
	Chip   [512]byte
}

// PICState mirrors struct kvm_pic_state: one i8259.
type PICState struct {
	LastIRR                uint8
	IRR                    uint8 // interrupt request register
	IMR                    uint8 // interrupt mask register
	ISR                    uint8 // in-service register
	PriorityAdd            uint8
	IRQBase                uint8 // vector of IRQ 0 (ICW2)
	ReadRegSelect          uint8
	Poll                   uint8
	SpecialMask            uint8
	InitState              uint8
	AutoEOI                uint8
	RotateOnAutoEOI        uint8
	SpecialFullyNestedMode uint8
	Init4                  uint8
	ELCR                   uint8 // edge/level control
	ELCRMask               uint8
}

// ioapicPins is KVM_IOAPIC_NUM_PINS.
const ioapicPins = 24

// IOAPICState mirrors struct kvm_ioapic_state.
type IOAPICState struct {
	BaseAddress uint64
	IORegSel    uint32
	ID          uint32
	IRR         uint32
	_           uint32
	RedirTbl    [ioapicPins]uint64 // redirection entries, as the guest programs them
}

// PITChannelState mirrors struct kvm_pit_channel_state: one i8254 counter.
type PITChannelState struct {
	Count         uint32
	LatchedCount  uint16
	CountLatched  uint8
	StatusLatched uint8
	Status        uint8
	ReadState     uint8
	WriteState    uint8
	WriteLatch    uint8
	RWMode        uint8
	Mode          uint8
	BCD           uint8
	Gate          uint8
	// CountLoadTime is the host's ktime when the count was loaded. It is
	// meaningless on another host or later: KVM_SET_PIT2 reloads each
	// counter at the time of the call.
	CountLoadTime int64
}

// PITState2 mirrors struct kvm_pit_state2: the in-kernel i8254.
type PITState2 struct {
	Channels [3]PITChannelState
	Flags    uint32 // PITFlag*
	_        [9]uint32
}

// dirtyLog mirrors struct kvm_dirty_log; Bitmap is the user address of the
// bitmap KVM fills (the union's dirty_bitmap pointer).
type dirtyLog struct {
	Slot   uint32
	_      uint32
	Bitmap uint64
}
