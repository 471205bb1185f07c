package devices

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestDebugExit(t *testing.T) {
	tests := []struct {
		name  string
		write []byte
		want  []int
	}{
		{"zero", []byte{0}, []int{0}},
		{"status 3", []byte{3}, []int{3}},
		{"top byte", []byte{0xff}, []int{255}},
		{"16-bit out: low byte", []byte{0x2a, 0x01}, []int{0x2a}},
		{"32-bit out: low byte", []byte{0x07, 0xff, 0xff, 0xff}, []int{7}},
		{"zero-width write", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			d := &DebugExit{Exit: func(s int) { got = append(got, s) }}
			d.Write(0, tc.write)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Exit calls (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDebugExitRead(t *testing.T) {
	d := &DebugExit{}
	b := []byte{1, 2, 3, 4}
	d.Read(0, b)
	if !bytes.Equal(b, make([]byte, 4)) {
		t.Errorf("read = %x, want zeros", b)
	}
	d.Write(0, []byte{1}) // no Exit func: must not panic
}
