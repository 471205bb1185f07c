package devices

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// fzRanges are the buses' claimed ranges as the machine registers them
// (setupDevices), plus an unclaimed port, each with a little overhang so
// that accesses straddle range ends.
var fzRanges = []struct {
	mmio       bool
	base, size uint64
}{
	{false, COM1Port, SerialPorts},
	{false, I8042DataPort, 1},
	{false, I8042CommandPort, 1},
	{false, CMOSPort, CMOSPorts},
	{false, DebugExitPort, 1},
	{false, PVWaitPort, 4},
	{false, PortBPort, 1},
	{false, PowerControlPort, PowerControlPorts},
	{false, 0x3000, 16}, // nobody's
	{true, IOAPICAddr, 0x20},
}

// FuzzPlatformIO plays a guest's port and MMIO accesses, and the host's
// console input, against the platform devices wired on two buses as the
// machine wires them. Each access is four input bytes: the range (sel), an
// offset in it (with overhang), a value, and flags (bits 0-1 width 1, 2,
// 4 or 8; bit 2 write; bit 3 instead: the host types n bytes of console
// input, as many as the FIFO has room for, so Input never blocks). Checked:
// nothing panics or blocks; unclaimed reads are all ones and counted; the
// serial receive FIFO, its output line buffer and the i8042's reply queue
// stay within their bounds; every IOAPIC update carries the routes the
// entries read back through IOWIN describe (masked exactly when bit 16 is
// set, unmasked ones aimed at the LAPIC window 0xfee00000).
func FuzzPlatformIO(f *testing.F) {
	acc := func(sel, off, val, flags byte) []byte { return []byte{sel, off, val, flags} }
	cat := func(parts ...[]byte) []byte { return bytes.Join(parts, nil) }
	f.Add(cat(acc(0, 3, 0x80, 4), acc(0, 0, 1, 4), acc(0, 3, 3, 4), acc(0, 1, 2, 4), acc(0, 0, 'h', 4), acc(0, 2, 0, 0)))
	f.Add(cat(acc(0, 0, 40, 8), acc(0, 5, 0, 0), acc(0, 0, 0, 0), acc(0, 4, 0x10, 4), acc(0, 0, 'x', 4)))
	f.Add(cat(acc(2, 0, 0x20, 4), acc(1, 0, 0, 0), acc(2, 0, 0x60, 4), acc(1, 0, 0x45, 4), acc(2, 0, 0xd1, 4), acc(1, 0, 1, 4), acc(2, 0, 0xfe, 4)))
	f.Add(cat(acc(3, 0, 0x0b, 4), acc(3, 1, 0, 0), acc(3, 0, 0x8f, 4), acc(3, 1, 0xaa, 4), acc(3, 0, 0xff, 4), acc(3, 1, 0, 0)))
	f.Add(cat(acc(9, 0, 0x10, 6), acc(9, 0x10, 0x31, 6), acc(9, 0, 0x11, 6), acc(9, 0x10, 0x02, 6), acc(9, 0x10, 0, 2), acc(9, 0, 0x01, 6), acc(9, 0x10, 0, 2)))
	// Linux's programming of pin 4: vector 0xb0, unmasked, destination 1.
	f.Add(cat(acc(9, 0, 0x18, 6), acc(9, 0x10, 0xb0, 6), acc(9, 0, 0x19, 6), acc(9, 0x10, 0x00, 6), acc(9, 0x10, 0, 2)))
	f.Add(cat(acc(7, 0, 0x20, 4), acc(7, 1, 0, 0), acc(7, 2, 6, 4), acc(5, 0, 10, 6), acc(4, 0, 3, 4), acc(6, 0, 0, 0), acc(8, 3, 1, 7)))
	f.Fuzz(func(t *testing.T, in []byte) {
		pio, mmio := NewBus("pio"), NewBus("mmio")
		var out bytes.Buffer
		irqs := 0
		serial := NewSerial(&out, func() { irqs++ })
		defer serial.Close()
		resets := 0
		kbd := NewI8042(func() { resets++ })
		exits := 0
		pv := NewPVWait()
		pv.Close() // waits return at once: the fuzzer's vCPU never sleeps
		power := &PowerControl{PowerOff: func() { exits++ }, Reset: func() { resets++ }}
		var lastUpdate *[IOAPICPins]IOAPICRoute
		ioapic := NewIOAPIC(1, func(r [IOAPICPins]IOAPICRoute) { lastUpdate = &r })
		for _, r := range []struct {
			base, size uint64
			dev        Device
		}{
			{COM1Port, SerialPorts, serial},
			{I8042DataPort, 1, kbd.DataPort()},
			{I8042CommandPort, 1, kbd.CommandPort()},
			{CMOSPort, CMOSPorts, NewCMOS(256<<20, 0)},
			{DebugExitPort, 1, &DebugExit{Exit: func(int) { exits++ }}},
			{PVWaitPort, 4, pv},
			{PortBPort, 1, &PortB{}},
			{PowerControlPort, PowerControlPorts, power},
		} {
			if err := pio.Register(r.base, r.size, "dev", r.dev); err != nil {
				t.Fatal(err)
			}
		}
		if err := mmio.Register(IOAPICAddr, IOAPICSize, "ioapic", ioapic); err != nil {
			t.Fatal(err)
		}
		for ; len(in) >= 4; in = in[4:] {
			sel, off, val, flags := in[0], in[1], in[2], in[3]
			r := fzRanges[int(sel)%len(fzRanges)]
			addr := r.base + uint64(off)%(r.size+2)
			if flags&8 != 0 {
				serial.mu.Lock()
				room := serialFIFO - len(serial.rx)
				serial.mu.Unlock()
				serial.Input(bytes.Repeat([]byte{val}, min(int(off)%80, room)))
				continue
			}
			data := make([]byte, 1<<(flags&3))
			for i := range data {
				data[i] = val + byte(i)*0x11
			}
			bus := pio
			if r.mmio {
				bus = mmio
			}
			lastUpdate = nil
			if flags&4 != 0 {
				bus.Write(addr, data)
			} else {
				before := bus.Unclaimed()
				if !bus.Read(addr, data) {
					if !bytes.Equal(data, bytes.Repeat([]byte{0xff}, len(data))) || bus.Unclaimed() != before+1 {
						t.Fatalf("unclaimed read at %#x: %x, unclaimed count %d -> %d", addr, data, before, bus.Unclaimed())
					}
				}
			}
			if lastUpdate != nil {
				if flags&4 == 0 {
					t.Fatalf("an IOAPIC read at %#x changed the routes", addr)
				}
				checkRoutes(t, ioapic, *lastUpdate)
			}
			serial.mu.Lock()
			rx := len(serial.rx)
			serial.mu.Unlock()
			serial.out.mu.Lock()
			line := len(serial.out.buf)
			serial.out.mu.Unlock()
			kbd.mu.Lock()
			kq := len(kbd.out)
			kbd.mu.Unlock()
			if rx > serialFIFO || line > lineBufSize || kq > 16 {
				t.Fatalf("bounds: serial FIFO %d (max %d), line buffer %d (max %d), i8042 replies %d (max 16)", rx, serialFIFO, line, lineBufSize, kq)
			}
		}
	})
}

// checkRoutes checks an IOAPIC update against the entries read back
// through the register window, as the guest would read them.
func checkRoutes(t *testing.T, a *IOAPIC, got [IOAPICPins]IOAPICRoute) {
	t.Helper()
	var sel [4]byte
	a.Read(ioapicRegSel, sel[:])
	defer a.Write(ioapicRegSel, sel[:])
	for pin := range IOAPICPins {
		var w [4]byte
		lo, hi := make([]byte, 4), make([]byte, 4)
		binary.LittleEndian.PutUint32(w[:], uint32(ioapicRedTbl+2*pin))
		a.Write(ioapicRegSel, w[:])
		a.Read(ioapicWin, lo)
		binary.LittleEndian.PutUint32(w[:], uint32(ioapicRedTbl+2*pin+1))
		a.Write(ioapicRegSel, w[:])
		a.Read(ioapicWin, hi)
		e := uint64(binary.LittleEndian.Uint32(lo)) | uint64(binary.LittleEndian.Uint32(hi))<<32
		r := got[pin]
		if r.Masked != (e&rteMasked != 0) {
			t.Fatalf("pin %d: entry %#x, route masked %v", pin, e, r.Masked)
		}
		if !r.Masked && (r.MSI.AddrLo&0xfff00000 != msiAddrBase || r.MSI.AddrHi != 0 || r.MSI.Data&0xff != uint32(e&0xff)) {
			t.Fatalf("pin %d: entry %#x became MSI %+v", pin, e, r.MSI)
		}
	}
}
