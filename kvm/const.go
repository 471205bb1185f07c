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
	CapTSCDeadlineTimer: "KVM_CAP_TSC_DEADLINE_TIMER",
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
