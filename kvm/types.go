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
