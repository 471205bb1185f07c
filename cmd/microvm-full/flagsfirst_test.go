package main

import (
	"strings"
	"testing"
)

// TestFlagsFirst: flags after a command's arguments move before them with
// their values; a guest command line, anything after "--" and the words
// of an unknown command stay where they are.
func TestFlagsFirst(t *testing.T) {
	app := newApp(nil, nil, nil)
	for _, tc := range []struct{ in, want string }{
		{"snapshot vm1 --out /tmp/s", "snapshot --out /tmp/s vm1"},
		{"snapshot vm1 --out=/tmp/s --stop", "snapshot --out=/tmp/s --stop vm1"},
		{"snapshot --out /tmp/s vm1", "snapshot --out /tmp/s vm1"},
		{"rm a -f b", "rm -f a b"},
		{"stop vm1 --timeout 5s", "stop --timeout 5s vm1"},
		{"image pull alpine:3 --platform linux/amd64", "image pull --platform linux/amd64 alpine:3"},
		{"image rm a -- -b", "image rm a -- -b"},
		{"restore /snap --name vm2 --detach", "restore --name vm2 --detach /snap"},
		{"logs vm1 --bogus", "logs --bogus vm1"},
		{"exec vm1 ls -l", "exec vm1 ls -l"},
		{"exec --vm vm1 -- ls -l", "exec --vm vm1 -- ls -l"},
		{"agent exec --uds u -- ls -l", "agent exec --uds u -- ls -l"},
		{"ci gitlab run script step --x", "ci gitlab run script step --x"},
		{"frobnicate a --b", "frobnicate a --b"},
		{"snapshot vm1 --out", "snapshot vm1 --out"},
	} {
		got := strings.Join(flagsFirst(app, append([]string{"microvm"}, strings.Fields(tc.in)...))[1:], " ")
		if got != tc.want {
			t.Errorf("%q: got %q, want %q", tc.in, got, tc.want)
		}
	}
}
