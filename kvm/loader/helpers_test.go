package loader

import (
	"encoding/binary"
	"testing"

	"github.com/microvm/microvm/kvm/guestmem"
)

const mib = 1 << 20

// machineRanges is the RAM layout the VMM builds for size bytes of memory
// (docs/machine.md): low RAM up to 3 GiB, the rest from 4 GiB.
func machineRanges(size uint64) []guestmem.Range {
	if size <= mmioGap {
		return []guestmem.Range{{GPA: 0, Size: size}}
	}
	return []guestmem.Range{{GPA: 0, Size: mmioGap}, {GPA: fourGiB, Size: size - mmioGap}}
}

// newMem is guest memory of size bytes backed by plain slices, or by lazily
// mapped anonymous memory above 256 MiB (untouched pages cost nothing).
func newMem(t testing.TB, size uint64) *guestmem.Memory {
	t.Helper()
	if size > 256*mib {
		m, err := guestmem.NewAnonymous(machineRanges(size)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = m.Close() })
		return m
	}
	var regs []guestmem.Region
	for _, r := range machineRanges(size) {
		regs = append(regs, guestmem.Region{GPA: r.GPA, Data: make([]byte, r.Size)})
	}
	m, err := guestmem.New(regs...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// bzSpec describes a synthetic bzImage. Zero fields take the defaults of
// defaultBz.
type bzSpec struct {
	magic       string
	version     uint16
	xloadflags  uint16
	loadflags   uint8
	setupSects  uint8
	jump        uint8 // second byte of the jump at 0x200
	initSize    uint32
	prefAddress uint64
	alignment   uint32
	relocatable uint8
	cmdlineSize uint32
	initrdMax   uint32
	kernelLen   int
	// sysSize is the header's syssize in 16-byte units; 0 means the real
	// size (kernelLen/16); -1 writes 0.
	sysSize int
}

func defaultBz() bzSpec {
	return bzSpec{
		magic: "HdrS", version: 0x020f, xloadflags: 0x3, loadflags: loadedHigh | canUseHeap,
		setupSects: 4, jump: 0x6a, initSize: 4 * mib, prefAddress: 0x1000000,
		alignment: 0x200000, relocatable: 1, cmdlineSize: 2047, initrdMax: 0x7fffffff,
		kernelLen: 64 << 10,
	}
}

// makeBzImage writes the setup header fields at their boot.rst offsets and
// fills the protected-mode part with a recognisable pattern.
func makeBzImage(s bzSpec) []byte {
	sects := int(s.setupSects)
	if sects == 0 {
		sects = 4
	}
	setup := (sects + 1) * 512
	b := make([]byte, setup+s.kernelLen)
	le := binary.LittleEndian
	b[0x1f1] = s.setupSects
	le.PutUint16(b[0x1fe:], 0xaa55)
	b[0x200], b[0x201] = 0xeb, s.jump
	copy(b[0x202:], s.magic)
	le.PutUint16(b[0x206:], s.version)
	b[0x211] = s.loadflags
	le.PutUint32(b[0x22c:], s.initrdMax)
	le.PutUint32(b[0x230:], s.alignment)
	b[0x234] = s.relocatable
	le.PutUint16(b[0x236:], s.xloadflags)
	le.PutUint32(b[0x238:], s.cmdlineSize)
	le.PutUint64(b[0x258:], s.prefAddress)
	le.PutUint32(b[0x260:], s.initSize)
	switch {
	case s.sysSize > 0:
		le.PutUint32(b[0x1f4:], uint32(s.sysSize))
	case s.sysSize == 0:
		le.PutUint32(b[0x1f4:], uint32((s.kernelLen+15)/16))
	}
	for i := setup; i < len(b); i++ {
		b[i] = byte(i*7 + 3)
	}
	return b
}

// elfSeg is a PT_LOAD segment of a synthetic ELF.
type elfSeg struct {
	paddr, vaddr uint64
	data         []byte
	memsz        uint64 // 0: len(data)
}

// elfSpec describes a synthetic ELF kernel.
type elfSpec struct {
	class32   bool
	machine   uint16 // 0: the class's x86 machine
	entry     uint64
	segs      []elfSeg
	notes     []byte // raw note block
	notePhdr  bool   // describe notes with a PT_NOTE
	noteShdr  bool   // describe notes with an SHT_NOTE section
	noteAlign uint64 // p_align / sh_addralign of the note block
}

// note encodes one Elf_Nhdr record with name and descriptor padded to pad.
func note(name string, typ uint32, desc []byte, pad int) []byte {
	up := func(n int) int { return (n + pad - 1) / pad * pad }
	nm := name + "\x00"
	b := make([]byte, 12+up(len(nm))+up(len(desc)))
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(nm)))
	le.PutUint32(b[4:], uint32(len(desc)))
	le.PutUint32(b[8:], typ)
	copy(b[12:], nm)
	copy(b[12+up(len(nm)):], desc)
	return b
}

func pvhNote(entry uint32) []byte {
	d := make([]byte, 4)
	binary.LittleEndian.PutUint32(d, entry)
	return note("Xen", xenElfnotePhys32Entry, d, 4)
}

// makeELF lays out: ELF header, program headers, note block, segment data,
// then section headers (null + the note section) when asked.
func makeELF(s elfSpec) []byte {
	l := &elf64
	if s.class32 {
		l = &elf32
	}
	le := binary.LittleEndian
	put := func(b []byte, off, v uint64) {
		if l.word == 4 {
			le.PutUint32(b[off:], uint32(v))
		} else {
			le.PutUint64(b[off:], v)
		}
	}
	nph := len(s.segs)
	if s.notePhdr {
		nph++
	}
	off := l.ehsize + uint64(nph)*l.phsize
	noteOff := off
	off += uint64(len(s.notes))
	dataOff := make([]uint64, len(s.segs))
	for i, sg := range s.segs {
		off = (off + 15) &^ 15
		dataOff[i] = off
		off += uint64(len(sg.data))
	}
	shoff := (off + 7) &^ 7
	if s.noteShdr {
		off = shoff + 2*l.shsize
	}
	b := make([]byte, off)
	copy(b, "\x7fELF")
	b[4], b[5], b[6] = elfClass64, elfDataLSB, 1
	machine := s.machine
	if s.class32 {
		b[4] = elfClass32
		if machine == 0 {
			machine = elfMachine386
		}
	} else if machine == 0 {
		machine = elfMachineX64
	}
	le.PutUint16(b[16:], elfTypeExec)
	le.PutUint16(b[18:], machine)
	le.PutUint32(b[20:], 1)
	put(b, l.entry, s.entry)
	put(b, l.phoff, l.ehsize)
	le.PutUint16(b[l.phentsize:], uint16(l.phsize))
	le.PutUint16(b[l.phnum:], uint16(nph))
	if s.noteShdr {
		put(b, l.shoff, shoff)
		le.PutUint16(b[l.shentsize:], uint16(l.shsize))
		le.PutUint16(b[l.shnum:], 2)
	}
	ph := func(i int, typ uint32, offset, vaddr, paddr, filesz, memsz, align uint64) {
		p := b[l.ehsize+uint64(i)*l.phsize:]
		le.PutUint32(p[0:], typ)
		if s.class32 {
			put(p, 4, offset)
			put(p, 8, vaddr)
			put(p, 12, paddr)
			put(p, 16, filesz)
			put(p, 20, memsz)
			put(p, 28, align)
		} else {
			put(p, 8, offset)
			put(p, 16, vaddr)
			put(p, 24, paddr)
			put(p, 32, filesz)
			put(p, 40, memsz)
			put(p, 48, align)
		}
	}
	for i, sg := range s.segs {
		memsz := sg.memsz
		if memsz == 0 {
			memsz = uint64(len(sg.data))
		}
		vaddr := sg.vaddr
		if vaddr == 0 {
			vaddr = sg.paddr
		}
		ph(i, ptLoad, dataOff[i], vaddr, sg.paddr, uint64(len(sg.data)), memsz, 0x1000)
		copy(b[dataOff[i]:], sg.data)
	}
	align := s.noteAlign
	if align == 0 {
		align = 4
	}
	if s.notePhdr {
		ph(len(s.segs), ptNote, noteOff, 0, 0, uint64(len(s.notes)), uint64(len(s.notes)), align)
	}
	copy(b[noteOff:], s.notes)
	if s.noteShdr {
		sh := b[shoff+l.shsize:]
		le.PutUint32(sh[4:], shtNote)
		if s.class32 {
			put(sh, 16, noteOff)
			put(sh, 20, uint64(len(s.notes)))
			put(sh, 32, align)
		} else {
			put(sh, 24, noteOff)
			put(sh, 32, uint64(len(s.notes)))
			put(sh, 48, align)
		}
	}
	return b
}

// pattern is n recognisable bytes.
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i) ^ seed
	}
	return b
}

// defaultPVH is a small PVH ELF64 kernel at 16 MiB: 8 KiB of code, 4 KiB of bss.
func defaultPVH() elfSpec {
	return elfSpec{
		entry:    0xffffffff81000000,
		segs:     []elfSeg{{paddr: 0x1000000, vaddr: 0xffffffff81000000, data: pattern(8192, 0x5a), memsz: 12288}},
		notes:    append(note("GNU", 3, []byte{1, 2, 3, 4, 5, 6, 7, 8}, 4), pvhNote(0x1000100)...),
		notePhdr: true,
	}
}
