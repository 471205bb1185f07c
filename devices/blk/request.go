package blk

import (
	"encoding/binary"
	"fmt"

	"github.com/microvm/microvm/virtio"
)

// Request types (virtio 1.2, 5.2.6).
const (
	typeIn          = 0  // VIRTIO_BLK_T_IN
	typeOut         = 1  // VIRTIO_BLK_T_OUT
	typeFlush       = 4  // VIRTIO_BLK_T_FLUSH
	typeGetID       = 8  // VIRTIO_BLK_T_GET_ID
	typeDiscard     = 11 // VIRTIO_BLK_T_DISCARD
	typeWriteZeroes = 13 // VIRTIO_BLK_T_WRITE_ZEROES
)

// Request status values (5.2.6).
const (
	statusOK     = 0 // VIRTIO_BLK_S_OK
	statusIOErr  = 1 // VIRTIO_BLK_S_IOERR
	statusUnsupp = 2 // VIRTIO_BLK_S_UNSUPP
)

const (
	// SectorSize is the unit of sector numbers in requests (5.2.6: always
	// 512 bytes, whatever blk_size says).
	SectorSize = 512
	// headerSize is struct virtio_blk_req's leading part: le32 type, le32
	// reserved, le64 sector.
	headerSize = 16
	// segmentSize is struct virtio_blk_discard_write_zeroes: le64 sector,
	// le32 num_sectors, le32 flags.
	segmentSize = 16
	// idLen is the length of the GET_ID string (VIRTIO_BLK_ID_BYTES).
	idLen = 20
	// flagUnmap is the only defined segment flag (write zeroes may unmap).
	flagUnmap = 1

	// maxSegments bounds the segments of one discard or write-zeroes
	// request (config max_discard_seg, max_write_zeroes_seg).
	maxSegments = 32
	// maxSegSectors bounds num_sectors of one segment (config
	// max_discard_sectors, max_write_zeroes_sectors): 2 GiB.
	maxSegSectors = 1 << 22
)

// request is a parsed request header with its lengths checked against the
// chain and the disk. Parsing reads nothing but the 16-byte copy of the
// header, so it is a pure function the fuzzer drives directly.
type request struct {
	typ    uint32
	sector uint64
	// dataLen is the payload: for IN and GET_ID the writable bytes before
	// the status byte, for OUT, DISCARD and WRITE_ZEROES the readable
	// bytes after the header.
	dataLen uint64
	// status is non-zero when the request is refused without I/O
	// (IOERR, UNSUPP); reason says why, for the log.
	status byte
	reason string
}

// disk is what parsing needs to know about the device.
type disk struct {
	sectors  uint64 // capacity in 512-byte sectors
	readOnly bool
	features uint64 // negotiated
}

// parseRequest checks a request whose chain has rlen readable bytes,
// starting with hdr, and wlen writable bytes, ending with the status byte.
// An error (wrapping virtio.ErrGuest) means the chain has no shape a
// request may have: the device cannot even answer it. Anything else the
// guest got wrong is answered with a status.
func parseRequest(hdr [headerSize]byte, rlen, wlen uint64, d disk) (request, error) {
	if rlen < headerSize {
		return request{}, &guestErr{virtio.GuestErrHeader, fmt.Errorf("%w: block request with %d readable bytes; the header needs %d", virtio.ErrGuest, rlen, headerSize)}
	}
	if wlen < 1 {
		return request{}, &guestErr{virtio.GuestErrHeader, fmt.Errorf("%w: block request without a writable status byte", virtio.ErrGuest)}
	}
	r := request{
		typ:    binary.LittleEndian.Uint32(hdr[0:]),
		sector: binary.LittleEndian.Uint64(hdr[8:]),
	}
	refuse := func(status byte, format string, args ...any) (request, error) {
		r.status, r.reason = status, fmt.Sprintf(format, args...)
		return r, nil
	}
	switch r.typ {
	case typeIn, typeGetID:
		if rlen != headerSize {
			return r, &guestErr{virtio.GuestErrLayout, fmt.Errorf("%w: block read request (type %d) with %d readable bytes after its header", virtio.ErrGuest, r.typ, rlen-headerSize)}
		}
		r.dataLen = wlen - 1
	case typeOut, typeDiscard, typeWriteZeroes:
		if wlen != 1 {
			return r, &guestErr{virtio.GuestErrLayout, fmt.Errorf("%w: block write request (type %d) with %d writable bytes before its status", virtio.ErrGuest, r.typ, wlen-1)}
		}
		r.dataLen = rlen - headerSize
	case typeFlush:
		// Drivers send only the header and status; extra bytes are
		// ignored (5.2.6.2 does not define them).
		if d.features&FeatureFlush == 0 {
			return refuse(statusUnsupp, "flush without VIRTIO_BLK_F_FLUSH")
		}
		return r, nil
	default:
		return refuse(statusUnsupp, "request type %d", r.typ)
	}
	switch r.typ {
	case typeGetID:
		return r, nil
	case typeDiscard, typeWriteZeroes:
		feat, name := uint64(FeatureDiscard), "discard"
		if r.typ == typeWriteZeroes {
			feat, name = FeatureWriteZeroes, "write zeroes"
		}
		switch {
		case d.features&feat == 0:
			return refuse(statusUnsupp, "%s without its feature", name)
		case d.readOnly:
			return refuse(statusIOErr, "%s on a read-only disk", name)
		case r.dataLen == 0 || r.dataLen%segmentSize != 0 || r.dataLen/segmentSize > maxSegments:
			return refuse(statusIOErr, "%s with %d bytes of segments (16 each, 1..%d)", name, r.dataLen, maxSegments)
		}
		return r, nil
	}
	// IN and OUT.
	if r.typ == typeOut && d.readOnly {
		return refuse(statusIOErr, "write on a read-only disk")
	}
	if r.dataLen%SectorSize != 0 {
		return refuse(statusIOErr, "data of %d bytes is not a multiple of %d", r.dataLen, SectorSize)
	}
	if err := checkRange(r.sector, r.dataLen/SectorSize, d.sectors); err != "" {
		return refuse(statusIOErr, "%s", err)
	}
	return r, nil
}

// checkRange checks that n sectors from sector lie on a disk of capacity
// sectors, without overflowing; it returns why not, or "".
func checkRange(sector, n, capacity uint64) string {
	if sector > capacity || n > capacity-sector {
		return fmt.Sprintf("sectors %d+%d are beyond the disk's %d", sector, n, capacity)
	}
	return ""
}

// segment is one discard or write-zeroes range.
type segment struct {
	sector, sectors uint64
	flags           uint32
}

// parseSegment decodes a segment and checks it for request type typ; it
// returns a status and why when the request must be refused.
func parseSegment(b [segmentSize]byte, typ uint32, capacity uint64) (segment, byte, string) {
	s := segment{
		sector:  binary.LittleEndian.Uint64(b[0:]),
		sectors: uint64(binary.LittleEndian.Uint32(b[8:])),
		flags:   binary.LittleEndian.Uint32(b[12:]),
	}
	// 5.2.6.2: unmap is only defined for write zeroes; other bits are
	// reserved.
	allowed := uint32(0)
	if typ == typeWriteZeroes {
		allowed = flagUnmap
	}
	if s.flags&^allowed != 0 {
		return s, statusUnsupp, fmt.Sprintf("segment flags %#x", s.flags)
	}
	if s.sectors > maxSegSectors {
		return s, statusIOErr, fmt.Sprintf("segment of %d sectors; at most %d", s.sectors, maxSegSectors)
	}
	if err := checkRange(s.sector, s.sectors, capacity); err != "" {
		return s, statusIOErr, err
	}
	return s, statusOK, ""
}
