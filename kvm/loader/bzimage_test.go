package loader

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/bobuhiro11/gokvm/bootparam"
)

// bootRstHeader is the setup header table of Documentation/arch/x86/boot.rst
// ("The Real-Mode Kernel Header"): offset, size, boot.rst name, and the name
// of the matching field in gokvm's bootparam.SetupHeader.
var bootRstHeader = []struct {
	off, size int
	name      string
	gokvm     string
}{
	{0x1f1, 1, "setup_sects", "SetupSects"},
	{0x1f2, 2, "root_flags", "RootFlags"},
	{0x1f4, 4, "syssize", "SysSize"},
	{0x1f8, 2, "ram_size", "RAMSize"},
	{0x1fa, 2, "vid_mode", "VidMode"},
	{0x1fc, 2, "root_dev", "RootDev"},
	{0x1fe, 2, "boot_flag", "BootFlag"},
	{0x200, 2, "jump", "Jump"},
	{0x202, 4, "header", "Header"},
	{0x206, 2, "version", "Version"},
	{0x208, 4, "realmode_swtch", "ReadModeSwitch"},
	{0x20c, 2, "start_sys_seg", "StartSysSeg"},
	{0x20e, 2, "kernel_version", "KernelVersion"},
	{0x210, 1, "type_of_loader", "TypeOfLoader"},
	{0x211, 1, "loadflags", "LoadFlags"},
	{0x212, 2, "setup_move_size", "SetupMoveSize"},
	{0x214, 4, "code32_start", "Code32Start"},
	{0x218, 4, "ramdisk_image", "RamdiskImage"},
	{0x21c, 4, "ramdisk_size", "RamdiskSize"},
	{0x220, 4, "bootsect_kludge", "BootsectKludge"},
	{0x224, 2, "heap_end_ptr", "HeapEndPtr"},
	{0x226, 1, "ext_loader_ver", "ExtLoaderVer"},
	{0x227, 1, "ext_loader_type", "ExtLoaderType"},
	{0x228, 4, "cmd_line_ptr", "CmdlinePtr"},
	{0x22c, 4, "initrd_addr_max", "InitrdAddrMax"},
	{0x230, 4, "kernel_alignment", "KernelAlignment"},
	{0x234, 1, "relocatable_kernel", "RelocatableKernel"},
	{0x235, 1, "min_alignment", "MinAlignment"},
	{0x236, 2, "xloadflags", "XloadFlags"},
	{0x238, 4, "cmdline_size", "CmdlineSize"},
	{0x23c, 4, "hardware_subarch", "HardwareSubarch"},
	{0x240, 8, "hardware_subarch_data", "HardwareSubarchData"},
	{0x248, 4, "payload_offset", "PayloadOffset"},
	{0x24c, 4, "payload_length", "PayloadLength"},
	{0x250, 8, "setup_data", "SetupData"},
	{0x258, 8, "pref_address", "PrefAddress"},
	{0x260, 4, "init_size", "InitSize"},
	{0x264, 4, "handover_offset", "HandoverOffset"},
	{0x268, 4, "kernel_info_offset", "KernelInfoOffset"},
}

// TestGokvmSetupHeaderOffsets checks that gokvm's SetupHeader, decoded with
// encoding/binary (packed), puts every field at boot.rst's offset: each field
// gets a distinct value written at the documented offset and must decode to
// it. This is the condition for the loader's use of bootparam.New.
func TestGokvmSetupHeaderOffsets(t *testing.T) {
	if got, want := binary.Size(bootparam.SetupHeader{}), 0x26c-0x1f1; got != want {
		t.Fatalf("packed SetupHeader is %d bytes, boot.rst's header through kernel_info_offset is %d", got, want)
	}
	typ := reflect.TypeOf(bootparam.SetupHeader{})
	if typ.NumField() != len(bootRstHeader) {
		t.Fatalf("SetupHeader has %d fields, boot.rst %d", typ.NumField(), len(bootRstHeader))
	}
	b := make([]byte, 0x1000)
	want := map[string]uint64{}
	for i, f := range bootRstHeader {
		v := uint64(0x0102030405060708) * uint64(i+1) >> ((8 - f.size) * 8)
		switch f.name {
		case "header":
			v = hdrMagic
		case "version":
			v = 0x020f
		}
		for j := 0; j < f.size; j++ {
			b[f.off+j] = byte(v >> (8 * j))
		}
		want[f.gokvm] = v
		sf, ok := typ.FieldByName(f.gokvm)
		if !ok || int(sf.Type.Size()) != f.size {
			t.Errorf("%s: gokvm field %s missing or of the wrong size", f.name, f.gokvm)
		}
		if sf.Index[0] != i {
			t.Errorf("%s: gokvm field %s is field %d, boot.rst order says %d", f.name, f.gokvm, sf.Index[0], i)
		}
	}
	bp, err := bootparam.New(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	hv := reflect.ValueOf(bp.Hdr)
	for _, f := range bootRstHeader {
		if got := hv.FieldByName(f.gokvm).Uint(); got != want[f.gokvm] {
			t.Errorf("%s at %#x: gokvm decodes %#x, want %#x", f.name, f.off, got, want[f.gokvm])
		}
	}
}

// TestBootParamsOffsets checks the zero-page offsets the loader writes
// against arch/x86/include/uapi/asm/bootparam.h and boot.rst.
func TestBootParamsOffsets(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"ext_ramdisk_image", offExtRamdiskImage, 0x0c0},
		{"ext_ramdisk_size", offExtRamdiskSize, 0x0c4},
		{"ext_cmd_line_ptr", offExtCmdLinePtr, 0x0c8},
		{"acpi_rsdp_addr", offACPIRSDPAddr, 0x070},
		{"e820_entries", offE820Entries, 0x1e8},
		{"hdr", offSetupHeader, 0x1f1},
		{"e820_table", offE820Table, 0x2d0},
		{"e820_table end (_pad8)", offE820Table + MaxE820*e820EntrySize, 0xcd0},
	} {
		if c.got != c.want {
			t.Errorf("%s at %#x, want %#x", c.name, c.got, c.want)
		}
	}
	for _, f := range bootRstHeader {
		for name, off := range map[string]int{"vid_mode": offVidMode, "boot_flag": offBootFlag, "header": offHeader,
			"version": offVersion, "type_of_loader": offTypeOfLoader, "loadflags": offLoadFlags,
			"ramdisk_image": offRamdiskImage, "ramdisk_size": offRamdiskSize, "heap_end_ptr": offHeapEndPtr,
			"cmd_line_ptr": offCmdLinePtr, "kernel_alignment": offKernelAlignment, "cmdline_size": offCmdlineSize} {
			if f.name == name && f.off != off {
				t.Errorf("%s at %#x, boot.rst says %#x", name, off, f.off)
			}
		}
	}
}

func TestZeroPageEncoding(t *testing.T) {
	img := makeBzImage(defaultBz())
	hdr := img[offSetupHeader : 0x202+int(img[0x201])]
	e820 := E820(machineRanges(5 << 30))
	tests := []struct {
		name string
		zp   zeroPage
	}{
		{"bzImage", zeroPage{hdr: hdr, cmdline: CmdlineAddr, initrd: 0x3ff0000, initrdSize: 0x12345, e820: e820}},
		{"high parts", zeroPage{hdr: hdr, cmdline: 0x1_2345_6000, initrd: 0x2_0000_1000, initrdSize: 0x1_0000_0002, e820: e820}},
		{"ELF64 without header", zeroPage{cmdline: CmdlineAddr, cmdlineMax: 4095, e820: e820[:1]}},
		{"with ACPI", zeroPage{hdr: hdr, cmdline: CmdlineAddr, rsdp: 0xe0000, e820: e820}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := tc.zp.encode()
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != 4096 {
				t.Fatalf("zero page is %d bytes", len(b))
			}
			le := binary.LittleEndian
			u32 := func(off int) uint64 { return uint64(le.Uint32(b[off:])) }
			check := func(what string, got, want uint64) {
				t.Helper()
				if got != want {
					t.Errorf("%s = %#x, want %#x", what, got, want)
				}
			}
			check("vid_mode", uint64(le.Uint16(b[0x1fa:])), 0xffff)
			check("boot_flag", uint64(le.Uint16(b[0x1fe:])), 0xaa55)
			check("header", u32(0x202), hdrMagic)
			check("type_of_loader", uint64(b[0x210]), 0xff)
			check("heap_end_ptr", uint64(le.Uint16(b[0x224:])), 0)
			check("cmd_line_ptr", u32(0x228)|u32(0x0c8)<<32, tc.zp.cmdline)
			check("ramdisk_image", u32(0x218)|u32(0x0c0)<<32, tc.zp.initrd)
			check("ramdisk_size", u32(0x21c)|u32(0x0c4)<<32, tc.zp.initrdSize)
			check("e820_entries", uint64(b[0x1e8]), uint64(len(tc.zp.e820)))
			check("sentinel", uint64(b[0x1ef]), 0)
			check("acpi_rsdp_addr", le.Uint64(b[0x70:]), tc.zp.rsdp)
			for i, e := range tc.zp.e820 {
				p := b[0x2d0+20*i:]
				check("e820 addr", le.Uint64(p), e.Addr)
				check("e820 size", le.Uint64(p[8:]), e.Size)
				check("e820 type", uint64(le.Uint32(p[16:])), uint64(e.Type))
			}
			if tc.zp.hdr != nil {
				check("loadflags", uint64(b[0x211]), loadedHigh) // CAN_USE_HEAP cleared
				check("version", uint64(le.Uint16(b[0x206:])), 0x020f)
				check("init_size", u32(0x260), 4*mib)
				check("kernel_alignment", u32(0x230), 0x200000)
			} else {
				check("kernel_alignment", u32(0x230), 0x1000000)
				check("cmdline_size", u32(0x238), 4095)
			}
			// Nothing outside the known fields is written.
			for off := range b {
				known := off == 0x1e8 || (off >= 0x70 && off < 0x78) || (off >= 0xc0 && off < 0xcc) || (off >= 0x1f1 && off < 0x290) ||
					(off >= 0x2d0 && off < 0x2d0+20*len(tc.zp.e820))
				if !known && b[off] != 0 {
					t.Fatalf("byte %#x = %#x, want 0", off, b[off])
				}
			}
		})
	}
	if _, err := (&zeroPage{e820: make([]E820Entry, 129)}).encode(); !errors.Is(err, ErrTooBig) {
		t.Errorf("129 e820 entries: %v, want ErrTooBig", err)
	}
}

func TestBzImageAcceptance(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*bzSpec)
		memSize uint64
		kind    error  // nil: accepted
		msg     string // substring of the error
	}{
		{"ok", func(*bzSpec) {}, 64 * mib, nil, ""},
		{"setup_sects 0 means 4", func(s *bzSpec) { s.setupSects = 0 }, 64 * mib, nil, ""},
		{"setup_sects 30", func(s *bzSpec) { s.setupSects = 30 }, 64 * mib, nil, ""},
		{"not relocatable", func(s *bzSpec) { s.relocatable = 0; s.alignment = 0 }, 64 * mib, nil, ""},
		{"bad magic", func(s *bzSpec) { s.magic = "HdrX" }, 64 * mib, ErrUnknownFormat, "not a bzImage or ELF kernel"},
		{"protocol 2.05", func(s *bzSpec) { s.version = 0x0205 }, 64 * mib, ErrUnsupported, "2.05 is too old"},
		{"protocol 2.11 has no xloadflags", func(s *bzSpec) { s.version = 0x020b }, 64 * mib, ErrUnsupported, "no 64-bit entry point"},
		{"no XLF_KERNEL_64", func(s *bzSpec) { s.xloadflags = 0x2 }, 64 * mib, ErrUnsupported, "no 64-bit entry point"},
		{"zImage", func(s *bzSpec) { s.loadflags = 0 }, 64 * mib, ErrUnsupported, "zImage"},
		{"init_size too big", func(s *bzSpec) { s.initSize = 30 * mib }, 32 * mib, ErrTooBig, "needs 46 MiB (image 64 KiB at 0x100000, init_size 30 MiB from 0x1000000) but guest memory has 32 MiB"},
		{"init_size exactly fits", func(s *bzSpec) { s.initSize = 16 * mib }, 32 * mib, nil, ""},
		{"init_size 0", func(s *bzSpec) { s.initSize = 0 }, 64 * mib, ErrMalformed, "init_size is 0"},
		{"alignment not a power of two", func(s *bzSpec) { s.alignment = 0x300000 }, 64 * mib, ErrMalformed, "kernel_alignment"},
		{"header end past 0x290", func(s *bzSpec) { s.jump = 0xff }, 64 * mib, ErrMalformed, "setup header ends at"},
		{"header end before init_size", func(s *bzSpec) { s.jump = 0x10 }, 64 * mib, ErrMalformed, "setup header ends at"},
		{"no kernel after setup", func(s *bzSpec) { s.kernelLen = 0 }, 64 * mib, ErrMalformed, "before the kernel"},
		// Regression: a cut-off bzImage used to load and then triple-fault.
		{"truncated kernel", func(s *bzSpec) { s.sysSize = (64<<10)/16 + 1 }, 64 * mib, ErrMalformed, "truncated"},
		{"syssize 0 (unknown) accepted", func(s *bzSpec) { s.sysSize = -1 }, 64 * mib, nil, ""},
		{"absurd pref_address", func(s *bzSpec) { s.prefAddress = 1 << 40 }, 64 * mib, ErrMalformed, "absurd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := defaultBz()
			tc.edit(&spec)
			img := makeBzImage(spec)
			mem := newMem(t, tc.memSize)
			b, err := Load(mem, Config{Kernel: BytesImage("foo", img), Cmdline: "console=ttyS0", CPUs: 1})
			if tc.kind != nil {
				if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.msg) || !strings.HasPrefix(err.Error(), "kernel foo: ") {
					t.Fatalf("Load = %v, want %v containing %q", err, tc.kind, tc.msg)
				}
				if strings.Contains(err.Error(), "\n") {
					t.Fatalf("error %q spans lines", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if b.Kind != BzImage || b.Mode != Long64 || b.RIP != 0x100200 || b.RSI != 0x7000 || b.CR3 != 0x9000 {
				t.Fatalf("boot = %+v", b)
			}
			sects := int(spec.setupSects)
			if sects == 0 {
				sects = 4
			}
			got := make([]byte, spec.kernelLen)
			if err := mem.Read(KernelAddr, got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, img[(sects+1)*512:]) {
				t.Fatal("protected-mode kernel not loaded at 1 MiB from (setup_sects+1)*512")
			}
			if v, _ := mem.Read32(BootParamsAddr + 0x202); v != hdrMagic {
				t.Fatalf("boot_params header = %#x", v)
			}
		})
	}
}

func TestCmdline(t *testing.T) {
	spec := defaultBz()
	spec.cmdlineSize = 16
	img := makeBzImage(spec)
	for _, tc := range []struct {
		cmdline string
		ok      bool
	}{
		{"", true},
		{strings.Repeat("x", 16), true},
		{strings.Repeat("x", 17), false},
		{"a\x00b", false},
	} {
		mem := newMem(t, 64*mib)
		b, err := Load(mem, Config{Kernel: BytesImage("foo", img), Cmdline: tc.cmdline, CPUs: 1})
		if (err == nil) != tc.ok {
			t.Fatalf("cmdline of %d bytes: %v, want ok=%v", len(tc.cmdline), err, tc.ok)
		}
		if !tc.ok {
			continue
		}
		got := make([]byte, len(tc.cmdline)+1)
		if err := mem.Read(CmdlineAddr, got); err != nil || string(got) != tc.cmdline+"\x00" {
			t.Fatalf("cmdline in memory %q (%v)", got, err)
		}
		if b.Cmdline.GPA != CmdlineAddr || b.Cmdline.Size != uint64(len(tc.cmdline)+1) {
			t.Fatalf("Boot.Cmdline = %+v", b.Cmdline)
		}
		if p, _ := mem.Read32(BootParamsAddr + 0x228); p != CmdlineAddr {
			t.Fatalf("cmd_line_ptr = %#x", p)
		}
	}
}
