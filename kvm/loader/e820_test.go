package loader

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/microvm/microvm/kvm/guestmem"
)

func TestE820(t *testing.T) {
	low := []E820Entry{
		{0, 0x9fc00, E820RAM},
		{0x9fc00, 0x400, E820Reserved},
		{0xa0000, 0x60000, E820Reserved},
	}
	with := func(more ...E820Entry) []E820Entry { return append(append([]E820Entry(nil), low...), more...) }
	tests := []struct {
		name   string
		ranges []guestmem.Range
		want   []E820Entry
	}{
		{"64 MiB", machineRanges(64 * mib), with(E820Entry{0x100000, 63 * mib, E820RAM})},
		{"3 GiB", machineRanges(3 << 30), with(E820Entry{0x100000, 3<<30 - mib, E820RAM})},
		{"4 GiB", machineRanges(4 << 30), with(E820Entry{0x100000, 3<<30 - mib, E820RAM}, E820Entry{4 << 30, 1 << 30, E820RAM})},
		{"8 GiB", machineRanges(8 << 30), with(E820Entry{0x100000, 3<<30 - mib, E820RAM}, E820Entry{4 << 30, 5 << 30, E820RAM})},
		{"1 MiB", machineRanges(mib), low},
		{"adjacent regions merge", []guestmem.Range{{GPA: 0, Size: 2 * mib}, {GPA: 2 * mib, Size: 2 * mib}}, with(E820Entry{0x100000, 3 * mib, E820RAM})},
		{"unsorted", []guestmem.Range{{GPA: 4 << 30, Size: mib}, {GPA: 0, Size: 2 * mib}}, with(E820Entry{0x100000, mib, E820RAM}, E820Entry{4 << 30, mib, E820RAM})},
		{"low RAM only", []guestmem.Range{{GPA: 0, Size: 0x9f000}}, []E820Entry{{0, 0x9f000, E820RAM}}},
		{"none", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, E820(tc.ranges)); diff != "" {
				t.Fatalf("E820 (-want +got):\n%s", diff)
			}
		})
	}
}
