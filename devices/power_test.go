package devices

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPowerControl(t *testing.T) {
	tests := []struct {
		name    string
		offset  uint64
		write   []byte
		want    []string
		ignored uint64
	}{
		{"S5 with SLP_EN (Linux's acpi_hw_extended_sleep)", SleepControlReg, []byte{5<<2 | 1<<5}, []string{"off"}, 0},
		{"S5 without SLP_EN", SleepControlReg, []byte{5 << 2}, nil, 1},
		{"S3 with SLP_EN", SleepControlReg, []byte{3<<2 | 1<<5}, nil, 1},
		{"S5, reserved bits set", SleepControlReg, []byte{0xc3 | 5<<2 | 1<<5}, []string{"off"}, 0},
		{"wide write: first byte", SleepControlReg, []byte{5<<2 | 1<<5, 0xff}, []string{"off"}, 0},
		{"status: clearing WAK_STS", SleepStatusReg, []byte{0x80}, nil, 0},
		{"reset value", ResetReg, []byte{ResetValue}, []string{"reset"}, 0},
		{"other reset value", ResetReg, []byte{0x06}, nil, 1},
		{"zero-width write", SleepControlReg, nil, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			p := &PowerControl{PowerOff: func() { got = append(got, "off") }, Reset: func() { got = append(got, "reset") }}
			p.Write(tc.offset, tc.write)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("callbacks (-want +got):\n%s", diff)
			}
			if n := p.Ignored(); n != tc.ignored {
				t.Errorf("Ignored() = %d, want %d", n, tc.ignored)
			}
		})
	}
}

func TestPowerControlRead(t *testing.T) {
	p := &PowerControl{}
	for off := uint64(0); off < PowerControlPorts; off++ {
		b := []byte{1, 2}
		p.Read(off, b)
		if !bytes.Equal(b, []byte{0, 0}) {
			t.Errorf("read at %d = %x, want zeros", off, b)
		}
	}
	p.Write(SleepControlReg, []byte{5<<2 | 1<<5}) // no callbacks: must not panic
	p.Write(ResetReg, []byte{ResetValue})
}
