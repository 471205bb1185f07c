package microvm

import (
	"errors"
	"strings"
	"testing"
)

func TestDiskConfig(t *testing.T) {
	disk := DiskConfig{Path: "a.img"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string // "" for valid
		root string // rootCmdline of a valid config
	}{
		{name: "one disk", cfg: Config{Disks: []DiskConfig{disk}}},
		{name: "root rw", cfg: Config{Disks: []DiskConfig{disk, disk}, Root: "/dev/vdb"}, root: "root=/dev/vdb rw"},
		{name: "root ro", cfg: Config{Disks: []DiskConfig{{Path: "a", ReadOnly: true}}, Root: "/dev/vda"}, root: "root=/dev/vda ro"},
		{name: "too many", cfg: Config{Disks: make([]DiskConfig, maxDisks+1)}, want: "disks; at most"},
		{name: "no path", cfg: Config{Disks: []DiskConfig{{}}}, want: "no path"},
		{name: "long serial", cfg: Config{Disks: []DiskConfig{{Path: "a", Serial: strings.Repeat("s", 21)}}}, want: "longer than 20"},
		{name: "root not a disk", cfg: Config{Disks: []DiskConfig{disk}, Root: "/dev/vdb"}, want: "none of the disks"},
		{name: "root without disks", cfg: Config{Root: "/dev/sda"}, want: "none of the disks"},
		{name: "rng rate", cfg: Config{RNG: &RNGConfig{Rate: 1 << 31}}, want: "rng rate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Kernel = "k"
			c, err := tc.cfg.withDefaults()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if got := c.rootCmdline(); got != tc.root {
					t.Errorf("rootCmdline = %q; want %q", got, tc.root)
				}
				return
			}
			if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("withDefaults: %v; want ErrConfig saying %q", err, tc.want)
			}
		})
	}
}
