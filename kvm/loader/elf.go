package loader

import (
	"bytes"
	"encoding/binary"
	"math/bits"
)

// ELF constants (System V gABI; Xen's public/elfnote.h for the PVH note).
const (
	elfClass32    = 1
	elfClass64    = 2
	elfDataLSB    = 1
	elfTypeExec   = 2
	elfTypeDyn    = 3
	elfMachine386 = 3
	elfMachineX64 = 62
	ptLoad        = 1
	ptNote        = 4
	shtNote       = 7
	pnXNum        = 0xffff

	// xenElfnotePhys32Entry is XEN_ELFNOTE_PHYS32_ENTRY: the note, owned by
	// "Xen", whose descriptor is the 32-bit physical PVH entry point.
	xenElfnotePhys32Entry = 18

	maxPhdrs   = 256     // real kernels have a handful
	maxShdrs   = 1 << 14 // vmlinux has tens; enough for -ffunction-sections builds
	maxNoteLen = 1 << 20 // bytes of one note segment or section
)

// elfSegment is a PT_LOAD program header.
type elfSegment struct {
	offset, paddr, vaddr, filesz, memsz uint64
}

// elfKernel is what the loader needs from an ELF kernel.
type elfKernel struct {
	is64     bool
	entry    uint64 // e_entry
	loads    []elfSegment
	pvh      bool   // has XEN_ELFNOTE_PHYS32_ENTRY
	pvhEntry uint64 // its value
}

// elfLayout gives field offsets that differ between ELF32 and ELF64.
type elfLayout struct {
	ehsize                             uint64
	entry, phoff, shoff                uint64 // offsets in the ELF header
	phentsize, phnum, shentsize, shnum uint64
	word                               uint64 // 4 or 8: size of addresses/offsets
	phsize, shsize                     uint64
}

var (
	elf32 = elfLayout{ehsize: 52, entry: 24, phoff: 28, shoff: 32, phentsize: 42, phnum: 44, shentsize: 46, shnum: 48, word: 4, phsize: 32, shsize: 40}
	elf64 = elfLayout{ehsize: 64, entry: 24, phoff: 32, shoff: 40, phentsize: 54, phnum: 56, shentsize: 58, shnum: 60, word: 8, phsize: 56, shsize: 64}
)

// get reads a word (4 or 8 bytes, little-endian) at off.
func (l *elfLayout) get(b []byte, off uint64) uint64 {
	if l.word == 4 {
		return uint64(binary.LittleEndian.Uint32(b[off:]))
	}
	return binary.LittleEndian.Uint64(b[off:])
}

func u16(b []byte, off uint64) uint64 { return uint64(binary.LittleEndian.Uint16(b[off:])) }
func u32(b []byte, off uint64) uint64 { return uint64(binary.LittleEndian.Uint32(b[off:])) }

// isELF reports whether the file starts with the ELF magic.
func isELF(head []byte) bool { return bytes.HasPrefix(head, []byte("\x7fELF")) }

// parseELF reads and checks the ELF header, the program headers and (to find
// the PVH note when no PT_NOTE has it) the section headers. Every offset and
// size is checked against the file before it is read.
func parseELF(img Image) (*elfKernel, error) {
	ident, err := readAt(img, 0, 16, "ELF identification")
	if err != nil {
		return nil, err
	}
	var l *elfLayout
	switch ident[4] {
	case elfClass32:
		l = &elf32
	case elfClass64:
		l = &elf64
	default:
		return nil, bad(ErrMalformed, "ELF class %d is neither ELF32 nor ELF64", ident[4])
	}
	if ident[5] != elfDataLSB {
		return nil, bad(ErrUnsupported, "ELF data encoding %d is not little-endian", ident[5])
	}
	eh, err := readAt(img, 0, l.ehsize, "ELF header")
	if err != nil {
		return nil, err
	}
	k := &elfKernel{is64: l == &elf64, entry: l.get(eh, l.entry)}
	if t := u16(eh, 16); t != elfTypeExec && t != elfTypeDyn {
		return nil, bad(ErrUnsupported, "ELF type %d is not an executable", t)
	}
	wantMachine := uint64(elfMachine386)
	if k.is64 {
		wantMachine = elfMachineX64
	}
	if m := u16(eh, 18); m != wantMachine {
		return nil, bad(ErrUnsupported, "ELF machine %d is not x86 (want %d for this class)", m, wantMachine)
	}

	// Program headers.
	phoff, phnum, phentsize := l.get(eh, l.phoff), u16(eh, l.phnum), u16(eh, l.phentsize)
	if phnum == 0 || phnum == pnXNum || phnum > maxPhdrs {
		return nil, bad(ErrMalformed, "ELF has %d program headers (want 1..%d)", phnum, maxPhdrs)
	}
	if phentsize != l.phsize {
		return nil, bad(ErrMalformed, "ELF program header size %d (want %d)", phentsize, l.phsize)
	}
	phs, err := readAt(img, phoff, phnum*phentsize, "ELF program headers")
	if err != nil {
		return nil, err
	}
	var notes []noteBlock
	for i := uint64(0); i < phnum; i++ {
		ph := phs[i*phentsize : (i+1)*phentsize]
		var s elfSegment
		var typ, align uint64
		typ = u32(ph, 0)
		if k.is64 {
			s = elfSegment{offset: l.get(ph, 8), vaddr: l.get(ph, 16), paddr: l.get(ph, 24), filesz: l.get(ph, 32), memsz: l.get(ph, 40)}
			align = l.get(ph, 48)
		} else {
			s = elfSegment{offset: l.get(ph, 4), vaddr: l.get(ph, 8), paddr: l.get(ph, 12), filesz: l.get(ph, 16), memsz: l.get(ph, 20)}
			align = l.get(ph, 28)
		}
		switch typ {
		case ptLoad:
			if s.filesz > s.memsz {
				return nil, bad(ErrMalformed, "ELF segment %d has file size %#x above memory size %#x", i, s.filesz, s.memsz)
			}
			if end, c := bits.Add64(s.offset, s.filesz, 0); c != 0 || end > uint64(img.Size) {
				return nil, bad(ErrMalformed, "ELF segment %d (file offset %#x, %#x bytes) runs past the end of the file (%d bytes)", i, s.offset, s.filesz, img.Size)
			}
			if end, c := bits.Add64(s.paddr, s.memsz, 0); c != 0 || end > fourGiB {
				return nil, bad(ErrUnsupported, "ELF segment %d at physical %#x+%#x is not below 4 GiB", i, s.paddr, s.memsz)
			}
			if s.memsz > 0 {
				k.loads = append(k.loads, s)
			}
		case ptNote:
			notes = append(notes, noteBlock{offset: s.offset, size: s.filesz, align: align, what: "PT_NOTE segment"})
		}
	}
	if len(k.loads) == 0 {
		return nil, bad(ErrMalformed, "ELF has no loadable segment")
	}
	if err := k.findPVH(img, notes); err != nil {
		return nil, err
	}
	if k.pvh {
		return k, nil
	}

	// Section headers: some linkers leave the note out of PT_NOTE.
	shoff, shnum, shentsize := l.get(eh, l.shoff), u16(eh, l.shnum), u16(eh, l.shentsize)
	if shoff == 0 || shnum == 0 {
		return k, nil
	}
	if shnum > maxShdrs || shentsize != l.shsize {
		return nil, bad(ErrMalformed, "ELF section headers: %d of %d bytes (want at most %d of %d)", shnum, shentsize, maxShdrs, l.shsize)
	}
	shs, err := readAt(img, shoff, shnum*shentsize, "ELF section headers")
	if err != nil {
		return nil, err
	}
	notes = notes[:0]
	for i := uint64(0); i < shnum; i++ {
		sh := shs[i*shentsize : (i+1)*shentsize]
		if u32(sh, 4) != shtNote {
			continue
		}
		var off, size, align uint64
		if k.is64 {
			off, size, align = l.get(sh, 24), l.get(sh, 32), l.get(sh, 48)
		} else {
			off, size, align = l.get(sh, 16), l.get(sh, 20), l.get(sh, 32)
		}
		notes = append(notes, noteBlock{offset: off, size: size, align: align, what: "SHT_NOTE section"})
	}
	return k, k.findPVH(img, notes)
}

// noteBlock is a run of ELF notes: a PT_NOTE segment or an SHT_NOTE section.
type noteBlock struct {
	offset, size, align uint64
	what                string
}

// findPVH scans note blocks for XEN_ELFNOTE_PHYS32_ENTRY.
func (k *elfKernel) findPVH(img Image, blocks []noteBlock) error {
	for _, nb := range blocks {
		if nb.size == 0 {
			continue
		}
		if nb.size > maxNoteLen {
			return bad(ErrMalformed, "ELF %s of %d bytes is absurd", nb.what, nb.size)
		}
		b, err := readAt(img, nb.offset, nb.size, "ELF "+nb.what)
		if err != nil {
			return err
		}
		entry, ok, err := scanNotes(b, nb.align)
		if err != nil {
			return bad(ErrMalformed, "ELF %s at %#x: %v", nb.what, nb.offset, err)
		}
		if ok {
			k.pvh, k.pvhEntry = true, entry
			return nil
		}
	}
	return nil
}

// scanNotes walks Elf_Nhdr records (namesz, descsz, type, then name and
// descriptor, each padded to the block's alignment: 8 when the block is
// 8-aligned, else 4) and returns the PVH entry if the Xen PHYS32_ENTRY note
// is present. Its descriptor is 4 bytes in Linux (.long); an 8-byte one is
// accepted when its value fits 32 bits.
func scanNotes(b []byte, align uint64) (uint64, bool, error) {
	pad := uint64(4)
	if align == 8 {
		pad = 8
	}
	up := func(n uint64) uint64 { return (n + pad - 1) &^ (pad - 1) }
	size := uint64(len(b))
	for off := uint64(0); size-off >= 12; {
		namesz, descsz, typ := u32(b, off), u32(b, off+4), u32(b, off+8)
		name := off + 12
		desc := name + up(namesz) // namesz, descsz < 2^32: no overflow
		next := desc + up(descsz)
		if desc+descsz > size || name+namesz > size {
			return 0, false, bad(ErrMalformed, "note at %#x (name %d, descriptor %d bytes) overruns the block", off, namesz, descsz)
		}
		if typ == xenElfnotePhys32Entry && namesz == 4 && string(b[name:name+4]) == "Xen\x00" {
			var v uint64
			switch descsz {
			case 4:
				v = u32(b, desc)
			case 8:
				v = binary.LittleEndian.Uint64(b[desc:])
			default:
				return 0, false, bad(ErrMalformed, "PVH entry note has a %d-byte descriptor", descsz)
			}
			if v >= fourGiB {
				return 0, false, bad(ErrMalformed, "PVH entry %#x is not a 32-bit address", v)
			}
			return v, true, nil
		}
		if next >= size {
			break
		}
		off = next
	}
	return 0, false, nil
}
