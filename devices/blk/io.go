package blk

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// run executes the parsed request in sl, writes its status byte and returns
// the used length: the bytes written into the chain, status included.
func (s *session) run(sl *slot) uint32 {
	req := &sl.req
	w := sl.chain.Writer()
	var data uint64 // bytes written into the writable data part
	status := req.status
	if status == statusOK {
		var err error
		status, data, err = s.execute(sl)
		if err != nil {
			s.d.ctr.hostErrors.Add(1)
			s.d.log.WithError(err).WithField("type", req.typ).WithField("sector", req.sector).Warn("blk: request failed")
		}
	}
	if status != statusOK && req.reason == "" {
		req.reason = "host I/O error"
	}
	if status != statusOK && req.status != statusOK {
		s.d.ctr.refused.Add(1)
		s.d.log.WithField("type", req.typ).Debugf("blk: refused: %s", req.reason)
	}
	// The status is the last writable byte, after whatever data part the
	// request has (the Writer never writes past the chain).
	w.Advance(w.Len() - 1)
	w.Write([]byte{status})
	return uint32(data + 1)
}

// execute does the I/O of a request that passed parseRequest.
func (s *session) execute(sl *slot) (status byte, data uint64, err error) {
	req := &sl.req
	c := &s.d.ctr
	off := int64(req.sector * SectorSize) // parseRequest bounded it by the capacity
	switch req.typ {
	case typeIn:
		w := sl.chain.Writer()
		sl.views = w.Views(sl.views[:0], req.dataLen)
		var err error
		if s.d.cow != nil {
			sl.sub, err = s.d.cow.read(sl.views, uint64(off), req.dataLen, sl.sub)
		} else {
			err = fullIO(unix.Preadv, s.d.fd, sl.views, off)
		}
		if err != nil {
			return statusIOErr, 0, fmt.Errorf("read %d bytes at %d: %w", req.dataLen, off, err)
		}
		c.reads.Add(1)
		c.bytesRead.Add(req.dataLen)
		return statusOK, req.dataLen, nil
	case typeOut:
		r := sl.chain.Reader()
		var hdr [headerSize]byte
		r.Read(hdr[:]) // skip the header: parsed already
		sl.views = r.Views(sl.views[:0], req.dataLen)
		var err error
		if s.d.cow != nil {
			err = s.d.cow.write(sl.views, uint64(off), req.dataLen, sl.cowBlock())
		} else {
			err = fullIO(unix.Pwritev, s.d.fd, sl.views, off)
		}
		if err != nil {
			return statusIOErr, 0, fmt.Errorf("write %d bytes at %d: %w", req.dataLen, off, err)
		}
		c.writes.Add(1)
		c.bytesWritten.Add(req.dataLen)
		return statusOK, 0, nil
	case typeFlush:
		if s.d.cow != nil {
			// Nothing to make durable: the base is never written, and
			// the overlay is thrown away with the device, so syncing
			// it would cost the guest time and keep nothing.
			c.flushes.Add(1)
			return statusOK, 0, nil
		}
		if err := retryEINTR(func() error { return unix.Fdatasync(s.d.fd) }); err != nil {
			return statusIOErr, 0, fmt.Errorf("fdatasync: %w", err)
		}
		c.flushes.Add(1)
		return statusOK, 0, nil
	case typeGetID:
		w := sl.chain.Writer()
		n := w.Write(s.d.id[:min(uint64(idLen), req.dataLen)])
		c.getIDs.Add(1)
		return statusOK, uint64(n), nil
	case typeDiscard, typeWriteZeroes:
		return s.segments(sl)
	}
	return statusUnsupp, 0, nil // parseRequest lets no other type through
}

// segments runs a discard or write-zeroes request. Every segment is checked
// before any is acted on, so a bad one refuses the whole request.
func (s *session) segments(sl *slot) (byte, uint64, error) {
	req := &sl.req
	r := sl.chain.Reader()
	var hdr [headerSize]byte
	r.Read(hdr[:])
	var segs [maxSegments]segment
	n := int(req.dataLen / segmentSize) // 1..maxSegments: parseRequest checked
	for i := range n {
		var b [segmentSize]byte
		r.Read(b[:]) // copied out once: the guest may change it meanwhile
		seg, st, why := parseSegment(b, req.typ, s.disk.sectors)
		if st != statusOK {
			req.status, req.reason = st, fmt.Sprintf("segment %d: %s", i, why)
			return st, 0, nil
		}
		segs[i] = seg
	}
	for _, seg := range segs[:n] {
		off, length := int64(seg.sector*SectorSize), int64(seg.sectors*SectorSize)
		if length == 0 {
			continue
		}
		unmap := seg.flags&flagUnmap != 0
		var err error
		switch {
		case s.d.cow != nil && req.typ == typeDiscard:
			err = s.d.cow.discard(uint64(off), uint64(length))
		case s.d.cow != nil:
			err = s.d.cow.writeZeroes(uint64(off), uint64(length), unmap, sl.cowBlock())
		case req.typ == typeDiscard:
			err = discardRange(s.d.fd, off, length)
		default:
			err = zeroRange(s.d.fd, off, length, unmap)
		}
		if err != nil {
			return statusIOErr, 0, err
		}
	}
	if req.typ == typeDiscard {
		s.d.ctr.discards.Add(1)
	} else {
		s.d.ctr.writeZeroes.Add(1)
	}
	return statusOK, 0, nil
}

// discardRange punches a hole in fd. Discard is a hint (5.2.6.2): where
// the file system cannot punch holes the request still succeeds.
func discardRange(fd int, off, length int64) error {
	err := fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	if errors.Is(err, unix.EOPNOTSUPP) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("discard %d bytes at %d: %w", length, off, err)
	}
	return nil
}

// zeroRange zeroes a range of fd: a hole when the guest allows unmapping,
// else an allocated zero range; where the file system has neither, it
// writes zeroes.
func zeroRange(fd int, off, length int64, unmap bool) error {
	mode := uint32(unix.FALLOC_FL_ZERO_RANGE | unix.FALLOC_FL_KEEP_SIZE)
	if unmap {
		mode = unix.FALLOC_FL_PUNCH_HOLE | unix.FALLOC_FL_KEEP_SIZE
	}
	err := fallocate(fd, mode, off, length)
	if errors.Is(err, unix.EOPNOTSUPP) && unmap {
		err = fallocate(fd, unix.FALLOC_FL_ZERO_RANGE|unix.FALLOC_FL_KEEP_SIZE, off, length)
	}
	if errors.Is(err, unix.EOPNOTSUPP) {
		err = writeZeroBytes(fd, off, length)
	}
	if err != nil {
		return fmt.Errorf("write zeroes %d bytes at %d: %w", length, off, err)
	}
	return nil
}

var zeroes [64 << 10]byte

func writeZeroBytes(fd int, off, length int64) error {
	for length > 0 {
		n := min(length, int64(len(zeroes)))
		if err := fullIO(unix.Pwritev, fd, [][]byte{zeroes[:n]}, off); err != nil {
			return err
		}
		off += n
		length -= n
	}
	return nil
}

func fallocate(fd int, mode uint32, off, length int64) error {
	return retryEINTR(func() error { return unix.Fallocate(fd, mode, off, length) })
}

func retryEINTR(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// errShort is a read that hit the end of the file: the image shrank under
// the device.
var errShort = errors.New("transfer stopped short: end of the image file (did it shrink?)")

// fullIO runs op (preadv or pwritev) until all of iovs is done, at most
// iovMax buffers a call, resuming after short transfers. It trims its own
// copy of the slice headers, never the guest buffers.
func fullIO(op func(int, [][]byte, int64) (int, error), fd int, iovs [][]byte, off int64) error {
	for len(iovs) > 0 {
		batch := iovs[:min(len(iovs), iovMax)]
		n, err := op(fd, batch, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return errShort
		}
		off += int64(n)
		for n > 0 {
			if n >= len(iovs[0]) {
				n -= len(iovs[0])
				iovs = iovs[1:]
				continue
			}
			iovs[0] = iovs[0][n:]
			n = 0
		}
	}
	return nil
}
