package devices

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func cmosRead(c *CMOS, index byte) byte {
	c.Write(0, []byte{index})
	b := []byte{0xaa}
	c.Read(1, b)
	return b[0]
}

func TestCMOSTime(t *testing.T) {
	c := NewCMOS(64<<20, 0)
	// 2024-02-29 23:59:58 UTC, a Thursday; the clock is given in another zone
	// to check the RTC reports UTC.
	c.Now = func() time.Time {
		return time.Date(2024, 3, 1, 8, 59, 58, 0, time.FixedZone("JST", 9*3600))
	}
	got := map[string]byte{}
	for name, idx := range map[string]byte{
		"seconds": rtcSeconds, "minutes": rtcMinutes, "hours": rtcHours, "weekday": rtcWeekday,
		"day": rtcDay, "month": rtcMonth, "year": rtcYear, "century": rtcCentury,
	} {
		got[name] = cmosRead(c, idx)
	}
	want := map[string]byte{
		"seconds": 0x58, "minutes": 0x59, "hours": 0x23, "weekday": 0x05, // Sunday = 1
		"day": 0x29, "month": 0x02, "year": 0x24, "century": 0x20,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RTC registers in BCD (-want +got):\n%s", diff)
	}
	// Bit 7 of the index is the NMI mask: it does not change the register.
	if got := cmosRead(c, 0x80|rtcYear); got != 0x24 {
		t.Errorf("year with the NMI bit set = %#x, want 0x24", got)
	}
	// The index register reads back.
	c.Write(0, []byte{rtcMonth})
	b := make([]byte, 1)
	c.Read(0, b)
	if b[0] != rtcMonth {
		t.Errorf("index port = %#x, want %#x", b[0], rtcMonth)
	}
}

func TestCMOSStatus(t *testing.T) {
	c := NewCMOS(64<<20, 0)
	want := map[byte]byte{rtcStatusA: 0x26, rtcStatusB: statusB24h, rtcStatusC: 0, rtcStatusD: statusDVRT}
	for idx, w := range want {
		if got := cmosRead(c, idx); got != w {
			t.Errorf("register %#x = %#x, want %#x", idx, got, w)
		}
	}
	// C and D are read-only; A's update-in-progress bit cannot be set.
	for _, idx := range []byte{rtcStatusC, rtcStatusD} {
		c.Write(0, []byte{idx})
		c.Write(1, []byte{0xff})
		if got := cmosRead(c, idx); got != want[idx] {
			t.Errorf("register %#x = %#x after a write, want it read-only (%#x)", idx, got, want[idx])
		}
	}
	c.Write(0, []byte{rtcStatusA})
	c.Write(1, []byte{0xa6})
	if got := cmosRead(c, rtcStatusA); got != 0x26 {
		t.Errorf("status A = %#x, want UIP masked off (0x26)", got)
	}
	// Other bytes are plain storage.
	c.Write(0, []byte{0x40})
	c.Write(1, []byte{0x5a})
	if got := cmosRead(c, 0x40); got != 0x5a {
		t.Errorf("NVRAM byte 0x40 = %#x, want 0x5a", got)
	}
}

func TestCMOSMemorySize(t *testing.T) {
	type bytes struct {
		Base, Ext, Ext2, High16 [2]byte
		High4G                  [3]byte
	}
	tests := []struct {
		name      string
		low, high uint64
		want      bytes
	}{
		// 640 KiB base = 0x280; 63 MiB extended = 0xfc00 KiB.
		{"64 MiB", 64 << 20, 0, bytes{[2]byte{0x80, 0x02}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0x03}, [3]byte{}}},
		{"8 MiB", 8 << 20, 0, bytes{[2]byte{0x80, 0x02}, [2]byte{0x00, 0x1c}, [2]byte{0x00, 0x1c}, [2]byte{}, [3]byte{}}},
		{"256 MiB", 256 << 20, 0, bytes{[2]byte{0x80, 0x02}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0x0f}, [3]byte{}}},
		// 3 GiB below the gap, 1 GiB above 4 GiB = 0x4000 units of 64 KiB.
		{"4 GiB split", 3 << 30, 1 << 30, bytes{[2]byte{0x80, 0x02}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0xbf}, [3]byte{0x00, 0x40, 0x00}}},
		{"1 TiB", 3 << 30, 1<<40 - 3<<30, bytes{[2]byte{0x80, 0x02}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0xfc}, [2]byte{0x00, 0xbf}, [3]byte{0x00, 0x40, 0xff}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCMOS(tc.low, tc.high)
			r2 := func(i byte) [2]byte { return [2]byte{cmosRead(c, i), cmosRead(c, i+1)} }
			got := bytes{
				Base: r2(cmosBaseLo), Ext: r2(cmosExtLo), Ext2: r2(cmosExt2Lo), High16: r2(cmosHigh16),
				High4G: [3]byte{cmosRead(c, cmosHigh4G), cmosRead(c, cmosHigh4G+1), cmosRead(c, cmosHigh4G+2)},
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("memory size bytes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCMOSZeroWidth(t *testing.T) {
	c := NewCMOS(64<<20, 0)
	c.Read(1, nil)
	c.Write(1, nil)
}
