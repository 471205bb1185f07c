package acpi

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// A minimal AML encoder (ACPI 6.5 chapter 20, "ACPI Machine Language
// Specification"): just what the DSDT needs. Each function returns the
// encoded bytes of one term; names come from this package's code, so an
// invalid one is a programming error and panics.

// AML opcodes and prefixes (20.3).
const (
	amlZeroOp          = 0x00
	amlOneOp           = 0x01
	amlNameOp          = 0x08
	amlBytePrefix      = 0x0a
	amlWordPrefix      = 0x0b
	amlDWordPrefix     = 0x0c
	amlStringPrefix    = 0x0d
	amlQWordPrefix     = 0x0e
	amlScopeOp         = 0x10
	amlBufferOp        = 0x11
	amlPackageOp       = 0x12
	amlMethodOp        = 0x14
	amlDualNamePrefix  = 0x2e
	amlMultiNamePrefix = 0x2f
	amlExtOpPrefix     = 0x5b
	amlArg0Op          = 0x68 // Arg0Op..Arg6Op are 0x68..0x6e
	amlDeviceOp        = 0x82 // after amlExtOpPrefix
	amlNotifyOp        = 0x86
	amlLEqualOp        = 0x93
	amlIfOp            = 0xa0
	amlRootChar        = '\\'
	amlPathSeparator   = '.' // ASL's, between NameSegs; not encoded
)

// nameSeg checks and returns a 4-character NameSeg (20.2.2): a lead
// character A-Z or '_', then A-Z, 0-9 or '_'. Shorter names are padded
// with '_' as ASL does.
func nameSeg(s string) []byte {
	if len(s) == 0 || len(s) > 4 {
		panic(fmt.Sprintf("acpi: AML name %q: want 1 to 4 characters", s))
	}
	b := []byte("____")
	copy(b, s)
	for i, c := range b {
		ok := c == '_' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9'
		if !ok {
			panic(fmt.Sprintf("acpi: AML name %q: bad character %q", s, c))
		}
	}
	return b
}

// nameString encodes a NameString (20.2.2), optionally rooted, of one or
// more segments as ASL writes them: "\_SB", "COM1", "\_SB.VGEN". One
// segment is the NameSeg alone, two take DualNamePrefix, more
// MultiNamePrefix and a count. (Parent prefixes, '^', are not needed.)
func nameString(s string) []byte {
	var b []byte
	if len(s) > 0 && s[0] == amlRootChar {
		b = append(b, amlRootChar)
		s = s[1:]
	}
	segs := strings.Split(s, string(amlPathSeparator))
	switch {
	case len(segs) == 2:
		b = append(b, amlDualNamePrefix)
	case len(segs) > 0xff:
		panic(fmt.Sprintf("acpi: AML name %q: more than 255 segments", s))
	case len(segs) > 2:
		b = append(b, amlMultiNamePrefix, byte(len(segs)))
	}
	for _, seg := range segs {
		b = append(b, nameSeg(seg)...)
	}
	return b
}

// pkgLength prefixes body with its PkgLength (20.2.4): the encoded length
// counts the PkgLength bytes themselves and everything after them. One
// byte holds up to 63; longer lengths take 2 to 4 bytes, the lead byte
// giving the count of following bytes in bits 7-6 and the low nibble of
// the length in bits 3-0.
func pkgLength(body []byte) []byte {
	n := len(body)
	var head []byte
	switch {
	case n+1 <= 0x3f:
		head = []byte{byte(n + 1)}
	case n+2 < 1<<12:
		t := n + 2
		head = []byte{0x40 | byte(t&0xf), byte(t >> 4)}
	case n+3 < 1<<20:
		t := n + 3
		head = []byte{0x80 | byte(t&0xf), byte(t >> 4), byte(t >> 12)}
	case n+4 < 1<<28:
		t := n + 4
		head = []byte{0xc0 | byte(t&0xf), byte(t >> 4), byte(t >> 12), byte(t >> 20)}
	default:
		panic(fmt.Sprintf("acpi: AML package of %d bytes is too long", n))
	}
	return append(head, body...)
}

func concat(parts [][]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// Integer encodes a constant integer (20.2.3, ComputationalData) in the
// shortest form: ZeroOp, OneOp, or a byte, word, dword or qword constant.
func Integer(v uint64) []byte {
	switch {
	case v == 0:
		return []byte{amlZeroOp}
	case v == 1:
		return []byte{amlOneOp}
	case v <= 0xff:
		return []byte{amlBytePrefix, byte(v)}
	case v <= 0xffff:
		return binary.LittleEndian.AppendUint16([]byte{amlWordPrefix}, uint16(v))
	case v <= 0xffff_ffff:
		return binary.LittleEndian.AppendUint32([]byte{amlDWordPrefix}, uint32(v))
	}
	return binary.LittleEndian.AppendUint64([]byte{amlQWordPrefix}, v)
}

// String encodes a string constant: ASCII, NUL-terminated.
func String(s string) []byte {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 || s[i] > 0x7f {
			panic(fmt.Sprintf("acpi: AML string %q: not ASCII without NUL", s))
		}
	}
	b := append([]byte{amlStringPrefix}, s...)
	return append(b, 0)
}

// EISAID encodes a compressed EISA ID such as "PNP0501" (ASL's EISAID
// macro, 19.6.35): three upper-case letters in 5 bits each and four hex
// digits, as a dword stored big-endian-packed so that the bytes read
// 0x41 0xd0 0x05 0x01 for PNP0501.
func EISAID(id string) []byte {
	if len(id) != 7 {
		panic(fmt.Sprintf("acpi: EISA ID %q: want 3 letters and 4 hex digits", id))
	}
	var v uint32
	for i := 0; i < 3; i++ {
		c := id[i]
		if c < 'A' || c > 'Z' {
			panic(fmt.Sprintf("acpi: EISA ID %q: %q is not an upper-case letter", id, c))
		}
		v = v<<5 | uint32(c-'@')
	}
	for i := 3; i < 7; i++ {
		c := id[i]
		var d uint32
		switch {
		case c >= '0' && c <= '9':
			d = uint32(c - '0')
		case c >= 'A' && c <= 'F':
			d = uint32(c-'A') + 10
		default:
			panic(fmt.Sprintf("acpi: EISA ID %q: %q is not a hex digit", id, c))
		}
		v = v<<4 | d
	}
	// v now holds the letters in bits 30-16 and the digits in bits 15-0;
	// the ID is stored as v's bytes in big-endian order.
	var be [4]byte
	binary.BigEndian.PutUint32(be[:], v)
	return Integer(uint64(binary.LittleEndian.Uint32(be[:])))
}

// Name encodes DefName (20.2.5.1): Name(name, obj).
func Name(name string, obj []byte) []byte {
	b := append([]byte{amlNameOp}, nameString(name)...)
	return append(b, obj...)
}

// Scope encodes DefScope: Scope(name) { terms }.
func Scope(name string, terms ...[]byte) []byte {
	body := append(nameString(name), concat(terms)...)
	return append([]byte{amlScopeOp}, pkgLength(body)...)
}

// Device encodes DefDevice (20.2.5.2): Device(name) { terms }.
func Device(name string, terms ...[]byte) []byte {
	body := append(nameString(name), concat(terms)...)
	return append([]byte{amlExtOpPrefix, amlDeviceOp}, pkgLength(body)...)
}

// Package encodes DefPackage with constant elements: Package() { elems }.
func Package(elems ...[]byte) []byte {
	if len(elems) > 0xff {
		panic("acpi: AML package with more than 255 elements")
	}
	body := append([]byte{byte(len(elems))}, concat(elems)...)
	return append([]byte{amlPackageOp}, pkgLength(body)...)
}

// Buffer encodes DefBuffer with its size as an integer constant.
func Buffer(data []byte) []byte {
	body := append(Integer(uint64(len(data))), data...)
	return append([]byte{amlBufferOp}, pkgLength(body)...)
}

// Method encodes DefMethod (20.2.5.2): Method(name, args, NotSerialized)
// { terms }, with args (0 to 7) in MethodFlags bits 0-2 and SyncLevel 0.
// A method of microvm's touches no state of its own, so none is
// Serialized.
func Method(name string, args int, terms ...[]byte) []byte {
	if args < 0 || args > 7 {
		panic(fmt.Sprintf("acpi: AML method %q with %d arguments: want 0 to 7", name, args))
	}
	body := append(nameString(name), byte(args))
	body = append(body, concat(terms)...)
	return append([]byte{amlMethodOp}, pkgLength(body)...)
}

// Arg encodes ArgObj (20.2.6.1): Arg0 to Arg6, a method's arguments.
func Arg(n int) []byte {
	if n < 0 || n > 6 {
		panic(fmt.Sprintf("acpi: AML Arg%d: want Arg0 to Arg6", n))
	}
	return []byte{amlArg0Op + byte(n)}
}

// If encodes DefIfElse without an Else (20.2.5.3): If (predicate) { terms }.
func If(predicate []byte, terms ...[]byte) []byte {
	body := append(append([]byte(nil), predicate...), concat(terms)...)
	return append([]byte{amlIfOp}, pkgLength(body)...)
}

// LEqual encodes DefLEqual (20.2.5.4): LEqual(a, b), ASL's a == b.
func LEqual(a, b []byte) []byte {
	return concat([][]byte{{amlLEqualOp}, a, b})
}

// Notify encodes DefNotify (20.2.5.3): Notify(object, value), object a
// name path such as "\_SB.VGEN".
func Notify(object string, value uint64) []byte {
	return concat([][]byte{{amlNotifyOp}, nameString(object), Integer(value)})
}

// Resource descriptors (6.4).
const (
	resIO            = 0x47 // small item: I/O port descriptor, 7 bytes of data
	resEndTag        = 0x79 // small item: end tag, 1 byte of data
	resMemory32Fixed = 0x86 // large item
	resExtInterrupt  = 0x89 // large item
	ioDecode16       = 1 << 0

	intConsumer  = 1 << 0
	intEdge      = 1 << 1
	intActiveLow = 1 << 2
	intShared    = 1 << 3
)

// ResourceTemplate encodes a buffer holding the descriptors followed by an
// End Tag whose checksum byte is 0 ("treated as if the checksum is valid",
// 6.4.2.9), as ASL's ResourceTemplate() does.
func ResourceTemplate(descs ...[]byte) []byte {
	b := append(concat(descs), resEndTag, 0)
	return Buffer(b)
}

// IO encodes an I/O Port Descriptor (6.4.2.5) with 16-bit decode for a
// fixed range of length ports at base: IO(Decode16, base, base, 1, length).
func IO(base uint16, length uint8) []byte {
	b := []byte{resIO, ioDecode16}
	b = binary.LittleEndian.AppendUint16(b, base) // minimum
	b = binary.LittleEndian.AppendUint16(b, base) // maximum
	return append(b, 1, length)                   // alignment, length
}

// Memory32Fixed encodes a 32-bit Fixed Memory Range Descriptor (6.4.3.4).
func Memory32Fixed(writable bool, base, length uint32) []byte {
	info := byte(0)
	if writable {
		info = 1
	}
	b := []byte{resMemory32Fixed, 9, 0, info}
	b = binary.LittleEndian.AppendUint32(b, base)
	return binary.LittleEndian.AppendUint32(b, length)
}

// Interrupt encodes an Extended Interrupt Descriptor (6.4.3.6) with one
// interrupt, for a consumer: Interrupt(ResourceConsumer, Edge or Level,
// ActiveHigh or ActiveLow, Exclusive or Shared) { gsi }.
func Interrupt(edge, activeLow, shared bool, gsi uint32) []byte {
	flags := byte(intConsumer)
	if edge {
		flags |= intEdge
	}
	if activeLow {
		flags |= intActiveLow
	}
	if shared {
		flags |= intShared
	}
	b := []byte{resExtInterrupt, 6, 0, flags, 1}
	return binary.LittleEndian.AppendUint32(b, gsi)
}
