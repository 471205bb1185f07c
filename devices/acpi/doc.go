// Package acpi writes the ACPI tables that describe the microvm machine to a
// guest: RSDP, XSDT, FADT, MADT and a DSDT whose AML this package encodes
// itself. References are to the ACPI Specification 6.5 by section.
//
// # What the tables say
//
//   - RSDP (5.2.5), revision 2, points at the XSDT only (no RSDT). It is the
//     first thing in the blob, which the machine places at TablesAddr, inside
//     the BIOS read-only area 0xe0000-0xfffff that Linux scans on 16-byte
//     boundaries; the loader also passes its address in boot_params
//     (acpi_rsdp_addr) and in the PVH hvm_start_info (rsdp_paddr).
//   - XSDT (5.2.8) lists the FADT and the MADT.
//   - FADT (5.2.9), revision 6: a hardware-reduced ACPI platform (no PM1
//     blocks, no SCI, no FACS, no GPEs). Its SLEEP_CONTROL_REG and
//     SLEEP_STATUS_REG (4.8.3.7, 4.8.3.8) and RESET_REG (4.8.3.6) are
//     byte-wide I/O ports the machine implements (devices.PowerControl):
//     SLP_EN with SLP_TYP = 5 (the \_S5 package's value) powers off, the
//     reset value restarts. IAPC_BOOT_ARCH says what legacy hardware exists.
//   - MADT (5.2.12): one Processor Local APIC per vCPU (UID = APIC ID = index),
//     the I/O APIC with GSI base 0, one Interrupt Source Override per ISA IRQ
//     0-15 to the GSI of the same number (the MP table's identity routing;
//     Linux on a hardware-reduced platform has no legacy PIC and sets up ISA
//     IRQs only from overrides), and LINT1 of every local APIC as NMI.
//   - DSDT (5.2.11.1, AML in chapter 20): \_S5 for power-off, and under \_SB
//     the COM1 UART (PNP0501: I/O 0x3f8-0x3ff, IRQ 4) and one LNRO0005 device
//     per virtio-mmio slot (Memory32Fixed window and an edge-triggered,
//     active-high Interrupt), which is how kernels built without
//     virtio_mmio's command-line device support find them; with
//     Machine.VMGenID, the VM generation ID's device (VGEN: _HID VMGENCTR,
//     _CID VM_Gen_Counter, ADDR the ID's address as two 32-bit halves)
//     and a Generic Event Device (ACPI0013, 5.6.9) whose _EVT method
//     notifies VGEN (0x80) when its interrupt fires (vmgenidDevices).
//
// The AML encoder (aml.go) has what these need: names and name paths,
// integers, strings, packages, buffers, scopes, devices, one kind of
// method with If, LEqual, Arg and Notify in it, and the resource
// descriptors. Its encodings are checked against iasl's.
//
// Build lays everything out for one base address and computes every checksum;
// the tables are plain bytes, built once before the guest starts.
//
// # Layout structs
//
// Fixed-layout tables are Go structs whose fields mirror the specification
// in order; encoding/binary writes them packed, little-endian, and a test
// checks each struct's binary.Size against the length the specification
// gives. Variable parts (XSDT entries, MADT entries, AML) are appended.
package acpi
