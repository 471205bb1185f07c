package microvm

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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

func TestParseDisk(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want DiskConfig
		bad  bool
	}{
		{in: "path=a.img", want: DiskConfig{Path: "a.img"}},
		{in: "path=/x/a.img,readonly,serial=disk0", want: DiskConfig{Path: "/x/a.img", ReadOnly: true, Serial: "disk0"}},
		{in: "serial=,path=a", want: DiskConfig{Path: "a"}},
		{in: "a.img", bad: true},
		{in: "path=", bad: true},
		{in: "readonly", bad: true},
		{in: "path=a,readonly=yes", bad: true},
		{in: "path=a,cache=none", bad: true},
		{in: "path=a,cow", want: DiskConfig{Path: "a", CopyOnWrite: true}},
		{in: "path=a,cow,readonly", bad: true},
		{in: "path=a,cow=1", bad: true},
	} {
		got, err := ParseDisk(tc.in)
		if tc.bad {
			if err == nil {
				t.Errorf("ParseDisk(%q) = %+v; want an error", tc.in, got)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseDisk(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseDisk(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}
