package kvm

import "strconv"

// Ioctl request encoding for x86 (include/uapi/asm-generic/ioctl.h):
// bits 0-7 number, 8-15 type, 16-29 argument size, 30-31 direction.
const (
	iocNone  = 0
	iocWrite = 1
	iocRead  = 2

	kvmio = 0xAE
)

// Ioctl numbers, named after their C macros in include/uapi/linux/kvm.h and
// spelled out as _IO/_IOR/_IOW/_IOWR would build them; the sizes are those of
// the argument structs (checked in kvm_test.go).
const (
	kvmGetAPIVersion       = iocNone<<30 | kvmio<<8 | 0x00
	kvmCreateVM            = iocNone<<30 | kvmio<<8 | 0x01
	kvmCheckExtension      = iocNone<<30 | kvmio<<8 | 0x03
	kvmGetVCPUMmapSize     = iocNone<<30 | kvmio<<8 | 0x04
	kvmGetSupportedCPUID   = (iocRead|iocWrite)<<30 | 8<<16 | kvmio<<8 | 0x05
	kvmCreateVCPU          = iocNone<<30 | kvmio<<8 | 0x41
	kvmSetUserMemoryRegion = iocWrite<<30 | 32<<16 | kvmio<<8 | 0x46
	kvmSetTSSAddr          = iocNone<<30 | kvmio<<8 | 0x47
	kvmCreateIRQChip       = iocNone<<30 | kvmio<<8 | 0x60
	kvmIRQLine             = iocWrite<<30 | 8<<16 | kvmio<<8 | 0x61
	kvmIRQFD               = iocWrite<<30 | 32<<16 | kvmio<<8 | 0x76
	kvmCreatePIT2          = iocWrite<<30 | 64<<16 | kvmio<<8 | 0x77
	kvmIOEventFD           = iocWrite<<30 | 64<<16 | kvmio<<8 | 0x79
	kvmRun                 = iocNone<<30 | kvmio<<8 | 0x80
	kvmGetRegs             = iocRead<<30 | 144<<16 | kvmio<<8 | 0x81
	kvmSetRegs             = iocWrite<<30 | 144<<16 | kvmio<<8 | 0x82
	kvmGetSregs            = iocRead<<30 | 312<<16 | kvmio<<8 | 0x83
	kvmSetSregs            = iocWrite<<30 | 312<<16 | kvmio<<8 | 0x84
	kvmGetMSRs             = (iocRead|iocWrite)<<30 | 8<<16 | kvmio<<8 | 0x88
	kvmSetMSRs             = iocWrite<<30 | 8<<16 | kvmio<<8 | 0x89
	kvmGetFPU              = iocRead<<30 | 416<<16 | kvmio<<8 | 0x8c
	kvmSetFPU              = iocWrite<<30 | 416<<16 | kvmio<<8 | 0x8d
	kvmGetLAPIC            = iocRead<<30 | 1024<<16 | kvmio<<8 | 0x8e
	kvmSetLAPIC            = iocWrite<<30 | 1024<<16 | kvmio<<8 | 0x8f
	kvmSetCPUID2           = iocWrite<<30 | 8<<16 | kvmio<<8 | 0x90
	kvmGetMPState          = iocRead<<30 | 4<<16 | kvmio<<8 | 0x98
	kvmGetTSCKHz           = iocNone<<30 | kvmio<<8 | 0xa3
	kvmEnableCap           = iocWrite<<30 | 104<<16 | kvmio<<8 | 0xa3
	kvmSetGSIRouting       = iocWrite<<30 | 8<<16 | kvmio<<8 | 0x6a
	kvmSignalMSI           = iocWrite<<30 | 32<<16 | kvmio<<8 | 0xa5

	// Saving and restoring state (snapshots). KVM_SET_IRQCHIP is _IOR in
	// the header, a historical slip kept for compatibility; the number
	// must be built the same way. KVM_GET_PIT2 / KVM_SET_PIT2 share their
	// numbers with KVM_GET_VCPU_EVENTS / KVM_SET_VCPU_EVENTS and differ by
	// size (and the fd they go to).
	kvmGetMSRIndexList = (iocRead|iocWrite)<<30 | 4<<16 | kvmio<<8 | 0x02
	kvmGetDirtyLog     = iocWrite<<30 | 16<<16 | kvmio<<8 | 0x42
	kvmGetIRQChip      = (iocRead|iocWrite)<<30 | 520<<16 | kvmio<<8 | 0x62
	kvmSetIRQChip      = iocRead<<30 | 520<<16 | kvmio<<8 | 0x63
	kvmSetClock        = iocWrite<<30 | 48<<16 | kvmio<<8 | 0x7b
	kvmGetClock        = iocRead<<30 | 48<<16 | kvmio<<8 | 0x7c
	kvmGetCPUID2       = (iocRead|iocWrite)<<30 | 8<<16 | kvmio<<8 | 0x91
	kvmSetMPState      = iocWrite<<30 | 4<<16 | kvmio<<8 | 0x99
	kvmGetVCPUEvents   = iocRead<<30 | 64<<16 | kvmio<<8 | 0x9f
	kvmGetPIT2         = iocRead<<30 | 112<<16 | kvmio<<8 | 0x9f
	kvmSetVCPUEvents   = iocWrite<<30 | 64<<16 | kvmio<<8 | 0xa0
	kvmSetPIT2         = iocWrite<<30 | 112<<16 | kvmio<<8 | 0xa0
	kvmGetDebugRegs    = iocRead<<30 | 128<<16 | kvmio<<8 | 0xa1
	kvmSetDebugRegs    = iocWrite<<30 | 128<<16 | kvmio<<8 | 0xa2
	kvmSetTSCKHz       = iocNone<<30 | kvmio<<8 | 0xa2
	kvmGetXSAVE        = iocRead<<30 | 4096<<16 | kvmio<<8 | 0xa4
	kvmSetXSAVE        = iocWrite<<30 | 4096<<16 | kvmio<<8 | 0xa5
	kvmGetXCRs         = iocRead<<30 | 392<<16 | kvmio<<8 | 0xa6
	kvmSetXCRs         = iocWrite<<30 | 392<<16 | kvmio<<8 | 0xa7
)

const expectedAPIVersion = 12

// Cap is a KVM capability number (KVM_CAP_*).
type Cap int

// Capabilities microvm checks for (include/uapi/linux/kvm.h).
const (
	CapIRQChip         Cap = 0
	CapUserMemory      Cap = 3
	CapSetTSSAddr      Cap = 4
	CapExtCPUID        Cap = 7
	CapNrVCPUs         Cap = 9
	CapNrMemslots      Cap = 10
	CapIRQRouting      Cap = 25
	CapIRQFD           Cap = 32
	CapPIT2            Cap = 33
	CapIOEventFD       Cap = 36
	CapMaxVCPUs        Cap = 66
	CapIRQFDResample   Cap = 82
	CapImmediateExit   Cap = 136
	CapGetTSCKHz       Cap = 61
	CapIOEventFDAnyLen Cap = 122
	CapSignalMSI       Cap = 77
	CapSplitIRQChip    Cap = 121
	// CapTSCDeadlineTimer: KVM emulates the LAPIC's TSC-deadline mode
	// (announced to the guest by the VMM: TSCDeadline).
	CapTSCDeadlineTimer Cap = 72

	// State save/restore (snapshots).
	CapPITState2   Cap = 35  // KVM_GET_PIT2 / KVM_SET_PIT2
	CapAdjustClock Cap = 39  // KVM_GET_CLOCK / KVM_SET_CLOCK
	CapVCPUEvents  Cap = 41  // KVM_GET_VCPU_EVENTS / KVM_SET_VCPU_EVENTS
	CapDebugRegs   Cap = 50  // KVM_GET_DEBUGREGS / KVM_SET_DEBUGREGS
	CapXSAVE       Cap = 55  // KVM_GET_XSAVE / KVM_SET_XSAVE
	CapXCRs        Cap = 56  // KVM_GET_XCRS / KVM_SET_XCRS
	CapTSCControl  Cap = 60  // KVM_SET_TSC_KHZ can scale the guest TSC
	CapXSAVE2      Cap = 208 // the XSAVE area's size, when it exceeds 4096 bytes
)

var capNames = map[Cap]string{
	CapIRQChip: "KVM_CAP_IRQCHIP", CapUserMemory: "KVM_CAP_USER_MEMORY",
	CapSetTSSAddr: "KVM_CAP_SET_TSS_ADDR", CapExtCPUID: "KVM_CAP_EXT_CPUID",
	CapNrVCPUs: "KVM_CAP_NR_VCPUS", CapNrMemslots: "KVM_CAP_NR_MEMSLOTS",
	CapIRQRouting: "KVM_CAP_IRQ_ROUTING", CapIRQFD: "KVM_CAP_IRQFD", CapPIT2: "KVM_CAP_PIT2",
	CapIOEventFD: "KVM_CAP_IOEVENTFD", CapMaxVCPUs: "KVM_CAP_MAX_VCPUS",
	CapIRQFDResample: "KVM_CAP_IRQFD_RESAMPLE", CapImmediateExit: "KVM_CAP_IMMEDIATE_EXIT",
	CapGetTSCKHz: "KVM_CAP_GET_TSC_KHZ", CapIOEventFDAnyLen: "KVM_CAP_IOEVENTFD_ANY_LENGTH",
	CapSignalMSI: "KVM_CAP_SIGNAL_MSI", CapSplitIRQChip: "KVM_CAP_SPLIT_IRQCHIP",
	CapTSCDeadlineTimer: "KVM_CAP_TSC_DEADLINE_TIMER", CapPITState2: "KVM_CAP_PIT_STATE2",
	CapAdjustClock: "KVM_CAP_ADJUST_CLOCK", CapVCPUEvents: "KVM_CAP_VCPU_EVENTS",
	CapDebugRegs: "KVM_CAP_DEBUGREGS", CapXSAVE: "KVM_CAP_XSAVE", CapXCRs: "KVM_CAP_XCRS",
	CapTSCControl: "KVM_CAP_TSC_CONTROL", CapXSAVE2: "KVM_CAP_XSAVE2",
}

// String is the capability's C name (KVM_CAP_*).
func (c Cap) String() string {
	if n, ok := capNames[c]; ok {
		return n
	}
	return "KVM_CAP_" + strconv.Itoa(int(c))
}

// ExitReason is kvm_run.exit_reason (KVM_EXIT_*).
type ExitReason uint32

// Exit reasons (include/uapi/linux/kvm.h).
const (
	ExitUnknown       ExitReason = 0
	ExitException     ExitReason = 1
	ExitIO            ExitReason = 2
	ExitHypercall     ExitReason = 3
	ExitDebug         ExitReason = 4
	ExitHLT           ExitReason = 5
	ExitMMIO          ExitReason = 6
	ExitIRQWindowOpen ExitReason = 7
	ExitShutdown      ExitReason = 8
	ExitFailEntry     ExitReason = 9
	ExitIntr          ExitReason = 10
	ExitSetTPR        ExitReason = 11
	ExitTPRAccess     ExitReason = 12
	ExitNMI           ExitReason = 16
	ExitInternalError ExitReason = 17
	ExitSystemEvent   ExitReason = 24
	ExitIOAPICEOI     ExitReason = 26
)

var exitNames = map[ExitReason]string{
	ExitUnknown: "UNKNOWN", ExitException: "EXCEPTION", ExitIO: "IO", ExitHypercall: "HYPERCALL",
	ExitDebug: "DEBUG", ExitHLT: "HLT", ExitMMIO: "MMIO", ExitIRQWindowOpen: "IRQ_WINDOW_OPEN",
	ExitShutdown: "SHUTDOWN", ExitFailEntry: "FAIL_ENTRY", ExitIntr: "INTR", ExitSetTPR: "SET_TPR",
	ExitTPRAccess: "TPR_ACCESS", ExitNMI: "NMI", ExitInternalError: "INTERNAL_ERROR",
	ExitSystemEvent: "SYSTEM_EVENT", ExitIOAPICEOI: "IOAPIC_EOI",
}

// String is the exit reason's C name (KVM_EXIT_*).
func (e ExitReason) String() string {
	if n, ok := exitNames[e]; ok {
		return "KVM_EXIT_" + n
	}
	return "KVM_EXIT_" + strconv.Itoa(int(e))
}

// SystemEvent is kvm_run.system_event.type (KVM_SYSTEM_EVENT_*).
type SystemEvent uint32

// System event types.
const (
	SystemEventShutdown SystemEvent = 1
	SystemEventReset    SystemEvent = 2
	SystemEventCrash    SystemEvent = 3
)

// MP states (KVM_MP_STATE_*).
const (
	MPStateRunnable      = 0
	MPStateUninitialized = 1
	MPStateInitReceived  = 2
	MPStateHalted        = 3
	MPStateSIPIReceived  = 4
)

// MemoryFlags are the flags of a memory slot (KVM_MEM_*).
type MemoryFlags uint32

// Memory slot flags.
const (
	// MemLogDirtyPages makes KVM track the slot's guest writes for
	// VM.DirtyLog (KVM_MEM_LOG_DIRTY_PAGES).
	MemLogDirtyPages MemoryFlags = 1 << 0
)

// In-kernel interrupt controllers, the chip ids of struct kvm_irqchip
// (KVM_IRQCHIP_*).
const (
	IRQChipPICMaster = 0
	IRQChipPICSlave  = 1
	IRQChipIOAPIC    = 2
)

// struct kvm_vcpu_events flags (KVM_VCPUEVENT_VALID_*): which optional
// members are meaningful.
const (
	VCPUEventValidNMIPending  = 1 << 0
	VCPUEventValidSIPIVector  = 1 << 1
	VCPUEventValidShadow      = 1 << 2
	VCPUEventValidSMM         = 1 << 3
	VCPUEventValidPayload     = 1 << 4
	VCPUEventValidTripleFault = 1 << 5
)

// struct kvm_clock_data flags (KVM_CLOCK_*).
const (
	// ClockTSCStable: the clock is derived from a stable TSC (GET only).
	ClockTSCStable = 1 << 1
	// ClockRealtime: Realtime is valid. Given to KVM_SET_CLOCK, KVM adds
	// the CLOCK_REALTIME time elapsed since Realtime to Clock.
	ClockRealtime = 1 << 2
	// ClockHostTSC: HostTSC is valid (GET only).
	ClockHostTSC = 1 << 3
)

// struct kvm_pit_state2 flags (KVM_PIT_FLAGS_*).
const (
	PITFlagHPETLegacy    = 1 << 0
	PITFlagSpeakerDataOn = 1 << 1
)

// ioeventfd flags (KVM_IOEVENTFD_FLAG_*).
const (
	ioeventfdFlagDatamatch = 1 << 0
	ioeventfdFlagPIO       = 1 << 1
	ioeventfdFlagDeassign  = 1 << 2
)

// irqfd flags (KVM_IRQFD_FLAG_*).
const irqfdFlagDeassign = 1 << 0

// PIT flags (KVM_PIT_SPEAKER_DUMMY).
const pitSpeakerDummy = 1

// RuntimeIoctls are the KVM requests a machine issues once it runs, after
// setup: KVM_RUN on every vCPU exit, KVM_SET_GSI_ROUTING when the guest
// reprograms the split irqchip's IOAPIC, KVM_GET_REGS / KVM_GET_SREGS
// when a stopped vCPU's registers are logged, KVM_IOEVENTFD when a guest
// driver first starts a virtio device (its queues' ioeventfds are
// registered then), and KVM_IRQFD / KVM_IOEVENTFD at teardown, which
// unregisters each before closing the VM (closing a VM that still has
// them costs 6-12 ms more on the hosts measured: docs/benchmarks.md,
// "Start-up"). Everything else (creating the VM, its
// memory, irqchip and vCPUs, CPUID, MSRs) is done by then. Package seccomp allows ioctl only with these requests (and a
// few non-KVM ones), so a new request issued at run time belongs here.
func RuntimeIoctls() []uint32 {
	return []uint32{kvmRun, kvmSetGSIRouting, kvmGetRegs, kvmGetSregs, kvmIRQFD, kvmIOEventFD}
}

// SnapshotIoctls are the KVM requests a running machine adds when it is
// snapshotted (VCPU.SaveState, VM.SaveState; the MSR index list is read
// at setup): a machine that may be snapshotted after setup (a named VM)
// needs them allowed too.
func SnapshotIoctls() []uint32 {
	return []uint32{kvmGetMPState, kvmGetVCPUEvents, kvmGetXSAVE, kvmGetXCRs, kvmGetDebugRegs, kvmGetLAPIC,
		kvmGetMSRs, kvmGetTSCKHz, kvmGetCPUID2, kvmGetClock, kvmGetIRQChip, kvmGetPIT2, kvmGetDirtyLog}
}
