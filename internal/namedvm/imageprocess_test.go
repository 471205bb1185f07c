package namedvm

import (
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/microvm/microvm/internal/image"
)

// TestImageProcess: docker run's rules for an image's command. Args
// replace Cmd but not the Entrypoint; the caller's variables replace the
// image's of the same name and add the rest; HOME is added for the
// image's user (/root for root or no user, / for another); the caller's
// working directory wins over the image's; the image's resolved user is
// the process's.
func TestImageProcess(t *testing.T) {
	u := func(n uint32) *uint32 { return &n }
	base := image.Config{
		Env:        []string{"PATH=/usr/bin", "LANG=C.UTF-8"},
		WorkingDir: "/src",
		Entrypoint: []string{"/entry.sh"},
		Cmd:        []string{"serve", "--port=80"},
	}
	withUser := func(cfg image.Config, name string, uid, gid uint32) image.Config {
		cfg.User, cfg.UID, cfg.GID = name, uid, gid
		return cfg
	}
	noEntry := base
	noEntry.Entrypoint = nil
	noCmd := base
	noCmd.Cmd = nil
	withHome := base
	withHome.Env = append([]string{"HOME=/home/app"}, base.Env...)
	for _, tc := range []struct {
		name      string
		cfg       image.Config
		args, env []string
		workdir   string
		want      Process
	}{
		{name: "entrypoint and cmd", cfg: base,
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/src"}},
		{name: "args replace cmd", cfg: base, args: []string{"sh", "-c", "id"},
			want: Process{Argv: []string{"/entry.sh", "sh", "-c", "id"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/src"}},
		{name: "cmd alone", cfg: noEntry,
			want: Process{Argv: []string{"serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/src"}},
		{name: "args without entrypoint", cfg: noEntry, args: []string{"true"},
			want: Process{Argv: []string{"true"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/src"}},
		{name: "entrypoint alone", cfg: noCmd,
			want: Process{Argv: []string{"/entry.sh"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/src"}},
		{name: "env merge", cfg: base, env: []string{"LANG=fr_FR.UTF-8", "X=1"},
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=fr_FR.UTF-8", "X=1", "HOME=/root"}, Workdir: "/src"}},
		{name: "caller's HOME", cfg: base, env: []string{"HOME=/tmp"},
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/tmp"}, Workdir: "/src"}},
		{name: "image's HOME", cfg: withHome,
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"HOME=/home/app", "PATH=/usr/bin", "LANG=C.UTF-8"}, Workdir: "/src"}},
		{name: "workdir", cfg: base, workdir: "/tmp",
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/tmp"}},
		{name: "user", cfg: withUser(base, "app", 1000, 1001),
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/"}, Workdir: "/src", UID: u(1000), GID: u(1001)}},
		{name: "root by name", cfg: withUser(base, "root", 0, 0),
			want: Process{Argv: []string{"/entry.sh", "serve", "--port=80"}, Env: []string{"PATH=/usr/bin", "LANG=C.UTF-8", "HOME=/root"}, Workdir: "/src", UID: u(0), GID: u(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ImageProcess(tc.cfg, tc.args, tc.env, tc.workdir)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Argv, tc.want.Argv) || !slices.Equal(got.Env, tc.want.Env) || got.Workdir != tc.want.Workdir ||
				!sameID(got.UID, tc.want.UID) || !sameID(got.GID, tc.want.GID) {
				t.Errorf("got argv %q env %q workdir %q uid %s gid %s\nwant argv %q env %q workdir %q uid %s gid %s",
					got.Argv, got.Env, got.Workdir, idString(got.UID), idString(got.GID),
					tc.want.Argv, tc.want.Env, tc.want.Workdir, idString(tc.want.UID), idString(tc.want.GID))
			}
		})
	}
}

// TestImageProcessNoCommand: an image without Entrypoint and Cmd needs
// args; the error says so.
func TestImageProcessNoCommand(t *testing.T) {
	if _, err := ImageProcess(image.Config{Env: []string{"A=1"}}, nil, nil, ""); !errors.Is(err, ErrNoCommand) {
		t.Errorf("no command anywhere: %v, want ErrNoCommand", err)
	}
	if p, err := ImageProcess(image.Config{}, []string{"ls"}, nil, ""); err != nil || !slices.Equal(p.Argv, []string{"ls"}) {
		t.Errorf("args only: %q, %v; want [ls]", p.Argv, err)
	}
}

// TestImageProcessNoAlias: the image's slices are not written through
// argv, so that a second process from the same image starts clean.
func TestImageProcessNoAlias(t *testing.T) {
	entry := make([]string, 1, 4)
	entry[0] = "/entry.sh"
	cfg := image.Config{Entrypoint: entry, Cmd: []string{"a"}}
	p1, _ := ImageProcess(cfg, []string{"one"}, nil, "")
	p2, _ := ImageProcess(cfg, []string{"two"}, nil, "")
	if !slices.Equal(p1.Argv, []string{"/entry.sh", "one"}) || !slices.Equal(p2.Argv, []string{"/entry.sh", "two"}) {
		t.Errorf("argv %q then %q: the second overwrote the first", p1.Argv, p2.Argv)
	}
}

func sameID(a, b *uint32) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func idString(p *uint32) string {
	if p == nil {
		return "nil"
	}
	return strconv.FormatUint(uint64(*p), 10)
}
