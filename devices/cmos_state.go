package devices

import "fmt"

// CMOSState is the snapshot form of a CMOS (see state.go): the index
// register and the 128 bytes of RTC registers and NVRAM. Fields are matched
// by name when decoded; a field added later must default (zero) to the
// behaviour of a snapshot that lacks it.
//
// The time of day is not saved: the RTC follows the host's wall clock
// (CMOS.Now), on the new host as on the old, so a restored guest that reads
// the RTC (at boot, or hwclock) gets the time of the restore, not of the
// save, as a machine resumed from suspend-to-disk does. The NVRAM bytes at
// the time registers' indices (seconds to year, century) are saved as
// stored, though reads never return them. (A guest-set offset from host
// time, if the RTC ever keeps one, would be a new field, zero meaning none.)
// The memory-size bytes are saved like any NVRAM byte: the guest can
// rewrite them, and a restored machine has the saved one's memory anyway.
// The RTC raises no interrupt (no IRQ 8 source is modelled), so restoring
// asserts nothing.
type CMOSState struct {
	// Index is the index register as last written, the NMI-mask bit 7
	// included.
	Index byte
	// NVRAM is every byte by index, 128 of them. Status A's update in
	// progress bit is clear, status C is 0 and status D says valid RAM and
	// time (0x80), as nothing else can be written there.
	NVRAM []byte
}

// SaveState returns the CMOS's state. See state.go for when to call it.
func (c *CMOS) SaveState() CMOSState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CMOSState{Index: c.index, NVRAM: append([]byte(nil), c.nvram[:]...)}
}

// RestoreState replaces the index register and NVRAM with st's, or
// returns an error wrapping ErrBadState, changing nothing, when st holds
// something the CMOS cannot (not exactly 128 bytes, a read-only status
// bit or register that differs from its only value). Now is left alone.
func (c *CMOS) RestoreState(st CMOSState) error {
	if err := st.check(); err != nil {
		return fmt.Errorf("cmos: restore: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.index = st.Index
	copy(c.nvram[:], st.NVRAM)
	return nil
}

// check reports the first field of st that a CMOS cannot hold.
func (st *CMOSState) check() error {
	if len(st.NVRAM) != cmosEntries {
		return fmt.Errorf("NVRAM of %d bytes, want %d: %w", len(st.NVRAM), cmosEntries, ErrBadState)
	}
	if v := st.NVRAM[rtcStatusA]; v&statusAUIP != 0 {
		return fmt.Errorf("status A %#02x has update in progress set, which is read-only: %w", v, ErrBadState)
	}
	if v := st.NVRAM[rtcStatusC]; v != 0 {
		return fmt.Errorf("status C %#02x, want 0 (read-only, no interrupt flags): %w", v, ErrBadState)
	}
	if v := st.NVRAM[rtcStatusD]; v != statusDVRT {
		return fmt.Errorf("status D %#02x, want %#02x (read-only): %w", v, statusDVRT, ErrBadState)
	}
	return nil
}
