package main

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/microvm/microvm/guest/agent"
	"github.com/microvm/microvm/internal/clibase"
	"github.com/microvm/microvm/internal/testing/testenv"
)

// vsockListener plays the VMM's hybrid-vsock socket in front of an
// in-process agent: Accept reads a client's "CONNECT <port>\n" and answers
// "OK 1073741824\n" for the agent's port; a CONNECT to another port is
// refused by closing the connection, as a VMM does when nothing listens.
type vsockListener struct {
	net.Listener
	port uint32
}

func (l vsockListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if readConnectLine(c) != fmt.Sprintf("CONNECT %d\n", l.port) {
			c.Close()
			continue
		}
		if _, err := c.Write([]byte("OK 1073741824\n")); err != nil {
			c.Close()
			continue
		}
		_ = c.SetDeadline(time.Time{})
		return c, nil
	}
}

// startAgent serves an agent (processes run on this host, files are this
// host's) behind a fake hybrid-vsock socket and returns the socket's path.
func startAgent(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mvm") // short: sun_path has 108 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	uds := filepath.Join(dir, "v.sock")
	ln, err := net.Listen("unix", uds)
	if err != nil {
		t.Fatal(err)
	}
	srv := agent.New(agent.Options{})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(vsockListener{ln, agentPort}) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return uds
}

// runMainIn is runMain with stdin.
func runMainIn(t *testing.T, stdin []byte, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	status := Main(append([]string{"microvm"}, args...), bytes.NewReader(stdin), &stdout, &stderr)
	return status, stdout.String(), stderr.String()
}

// TestAgentExec runs commands through an agent as `microvm agent exec`
// does with a running VM: streams apart, exit statuses, stdin, a missing
// command, --env, --workdir and --timeout.
func TestAgentExec(t *testing.T) {
	uds := startAgent(t)
	run := func(t *testing.T, stdin []byte, args ...string) (int, string, string) {
		t.Helper()
		return runMainIn(t, stdin, append([]string{"agent", "exec", "--uds", uds}, args...)...)
	}
	t.Run("streams and status", func(t *testing.T) {
		status, stdout, stderr := run(t, nil, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
		if status != 7 || stdout != "out\n" || stderr != "err\n" {
			t.Errorf("status %d stdout %q stderr %q; want 7, \"out\\n\", \"err\\n\"", status, stdout, stderr)
		}
	})
	t.Run("stdin through cat", func(t *testing.T) {
		in := make([]byte, 1<<20+7)
		if _, err := rand.Read(in); err != nil {
			t.Fatal(err)
		}
		status, stdout, stderr := run(t, in, "--port", "1024", "--", "cat")
		if status != 0 || stdout != string(in) {
			t.Errorf("status %d, %d bytes back (want 0 and the %d sent); stderr %q", status, len(stdout), len(in), stderr)
		}
	})
	t.Run("missing command", func(t *testing.T) {
		status, stdout, stderr := run(t, nil, "--", "/no/such/command")
		if status != 127 || stdout != "" {
			t.Errorf("status %d stdout %q; want 127 and nothing", status, stdout)
		}
		oneLine(t, "stderr", stderr, "agent exec: /no/such/command: not found in the guest")
	})
	t.Run("env and workdir", func(t *testing.T) {
		dir := t.TempDir()
		// A value with a comma is one value (not FOO=bar and a bare baz).
		status, stdout, stderr := run(t, nil, "--env", "FOO=bar,baz", "--workdir", dir, "--", "sh", "-c", `printf '%s|%s' "$FOO" "$(pwd)"`)
		if want := "bar,baz|" + dir; status != 0 || stdout != want {
			t.Errorf("status %d stdout %q stderr %q; want 0 and %q", status, stdout, stderr, want)
		}
	})
	// Regression: a working directory the guest does not have
	// came back as gRPC's "rpc error: code = FailedPrecondition desc = ..."
	// with status 1, like any failure.
	t.Run("no such working directory", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "nope")
		status, stdout, stderr := run(t, nil, "--workdir", missing, "--", "true")
		if status != 126 || stdout != "" {
			t.Errorf("status %d stdout %q; want 126 (found but cannot run) and nothing", status, stdout)
		}
		oneLine(t, "stderr", stderr, "agent exec: true: cannot run it: the agent: exec: working directory: ")
		if strings.Contains(stderr, "rpc error") || strings.Contains(stderr, "desc =") {
			t.Errorf("stderr %q shows gRPC's wrapping", stderr)
		}
	})
	// Regression: --uds naming no socket waited the whole
	// --connect-timeout (5 s by default) before saying so.
	t.Run("missing socket", func(t *testing.T) {
		missing := filepath.Join(t.TempDir(), "v.sock")
		start := time.Now()
		status, stdout, stderr := runMainIn(t, nil, "agent", "exec", "--uds", missing, "--", "true")
		if d := time.Since(start); d > time.Second {
			t.Errorf("gave up after %v; want at once", d)
		}
		if status != clibase.StatusFailure || stdout != "" {
			t.Errorf("status %d stdout %q; want %d and nothing", status, stdout, clibase.StatusFailure)
		}
		oneLine(t, "stderr", stderr, "agent exec: --uds "+missing+": no such file or directory (is the VM running? give its --vsock-uds)")
	})
	t.Run("signal", func(t *testing.T) {
		status, _, stderr := run(t, nil, "--", "sh", "-c", "kill -TERM $$")
		if status != 128+15 || stderr != "" {
			t.Errorf("status %d stderr %q; want 143 and nothing", status, stderr)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		status, _, stderr := run(t, nil, "--timeout", "100ms", "--", "sh", "-c", "sleep 100 & sleep 100")
		if status != 128+9 {
			t.Errorf("status %d; want 137", status)
		}
		oneLine(t, "stderr", stderr, "agent exec: sh: killed after --timeout 100ms")
	})
	t.Run("nothing on the port", func(t *testing.T) {
		start := time.Now()
		status, stdout, stderr := run(t, nil, "--port", "7", "--connect-timeout", "300ms", "--", "true")
		if status != clibase.StatusFailure || stdout != "" {
			t.Errorf("status %d stdout %q; want %d (a failure of the VM, not the command) and nothing", status, stdout, clibase.StatusFailure)
		}
		oneLine(t, "stderr", stderr, "agent exec: agentapi: connect: no agent accepted on vsock port 7 within --connect-timeout 300ms (last try: hybridvsock: ")
		if d := time.Since(start); d < 300*time.Millisecond || d > 5*time.Second {
			t.Errorf("gave up after %v, want about 300ms", d)
		}
	})
}

// TestAgentCp copies files into and out of the guest (here, this host's
// file system behind the agent) and checks content and mode bits.
func TestAgentCp(t *testing.T) {
	uds := startAgent(t)
	dir := t.TempDir()
	cp := func(t *testing.T, stdin []byte, src, dst string) (int, string, string) {
		t.Helper()
		return runMainIn(t, stdin, "agent", "cp", "--uds", uds, src, dst)
	}
	content := make([]byte, 200<<10+3) // several chunks
	if _, err := rand.Read(content); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(dir, "src")
	if err := os.WriteFile(src, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(src, 0o751); err != nil { // whatever the umask
		t.Fatal(err)
	}
	wantFile := func(t *testing.T, path string, content []byte, mode fs.FileMode) {
		t.Helper()
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, content) || st.Mode() != mode {
			t.Errorf("%s: %d bytes, mode %v; want the %d bytes sent, mode %v", path, len(got), st.Mode(), len(content), mode)
		}
	}
	ok := func(t *testing.T, status int, stdout, stderr string) {
		t.Helper()
		if status != 0 || stdout != "" || stderr != "" {
			t.Errorf("status %d stdout %q stderr %q; want 0 and nothing", status, stdout, stderr)
		}
	}

	t.Run("into the guest, making parents", func(t *testing.T) {
		dst := filepath.Join(dir, "in", "deep", "file")
		status, stdout, stderr := cp(t, nil, src, "guest:"+dst)
		ok(t, status, stdout, stderr)
		wantFile(t, dst, content, 0o751)
	})
	t.Run("into a guest directory", func(t *testing.T) {
		gdir := filepath.Join(dir, "gdir")
		status, stdout, stderr := cp(t, nil, src, "guest:"+gdir+"/")
		ok(t, status, stdout, stderr)
		wantFile(t, filepath.Join(gdir, "src"), content, 0o751)
	})
	t.Run("stdin into the guest", func(t *testing.T) {
		dst := filepath.Join(dir, "from-stdin")
		status, stdout, stderr := cp(t, []byte("hello"), "-", "guest:"+dst)
		ok(t, status, stdout, stderr)
		wantFile(t, dst, []byte("hello"), 0o644)
	})

	gsrc := filepath.Join(dir, "guest-file")
	if err := os.WriteFile(gsrc, content, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(gsrc, 0o604); err != nil {
		t.Fatal(err)
	}
	t.Run("out of the guest", func(t *testing.T) {
		out := t.TempDir()
		dst := filepath.Join(out, "copy")
		status, stdout, stderr := cp(t, nil, "guest:"+gsrc, dst)
		ok(t, status, stdout, stderr)
		wantFile(t, dst, content, 0o604)
		// Again, over the file just written.
		status, stdout, stderr = cp(t, nil, "guest:"+gsrc, dst)
		ok(t, status, stdout, stderr)
		wantFile(t, dst, content, 0o604)
		wantEntries(t, out, "copy")
	})
	t.Run("out of the guest into a directory", func(t *testing.T) {
		out := t.TempDir()
		status, stdout, stderr := cp(t, nil, "guest:"+gsrc, out)
		ok(t, status, stdout, stderr)
		wantFile(t, filepath.Join(out, "guest-file"), content, 0o604)
	})
	t.Run("out of the guest to stdout", func(t *testing.T) {
		status, stdout, stderr := cp(t, nil, "guest:"+gsrc, "-")
		if status != 0 || stdout != string(content) || stderr != "" {
			t.Errorf("status %d, %d bytes on stdout, stderr %q; want 0 and the %d bytes", status, len(stdout), stderr, len(content))
		}
	})

	t.Run("directories", func(t *testing.T) {
		tree := t.TempDir()
		if err := os.MkdirAll(filepath.Join(tree, "a", "b"), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tree, "a", "b", "f"), content, 0o640); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("a/b/f", filepath.Join(tree, "l")); err != nil {
			t.Fatal(err)
		}
		// In: the guest path becomes the directory (made with its parents).
		gdst := filepath.Join(dir, "tree-in", "copy")
		status, stdout, stderr := cp(t, nil, tree, "guest:"+gdst)
		ok(t, status, stdout, stderr)
		wantFile(t, filepath.Join(gdst, "a", "b", "f"), content, 0o640)
		if l, err := os.Readlink(filepath.Join(gdst, "l")); err != nil || l != "a/b/f" {
			t.Errorf("the link: %q, %v", l, err)
		}
		// Out to a new path: it becomes the directory; into an existing
		// directory: under the guest directory's name.
		out := t.TempDir()
		status, stdout, stderr = cp(t, nil, "guest:"+gdst, filepath.Join(out, "new"))
		ok(t, status, stdout, stderr)
		wantFile(t, filepath.Join(out, "new", "a", "b", "f"), content, 0o640)
		status, stdout, stderr = cp(t, nil, "guest:"+gdst, out)
		ok(t, status, stdout, stderr)
		wantFile(t, filepath.Join(out, "copy", "a", "b", "f"), content, 0o640)
		wantEntries(t, out, "copy", "new") // no temporary directory left
		// Out to stdout: a tar archive, as docker cp writes.
		status, stdout, stderr = cp(t, nil, "guest:"+gdst, "-")
		if status != 0 || stderr != "" {
			t.Fatalf("to stdout: status %d stderr %q", status, stderr)
		}
		names := map[string]bool{}
		tr := tar.NewReader(strings.NewReader(stdout))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			names[h.Name] = true
		}
		if !names["a/b/f"] || !names["l"] {
			t.Errorf("the tar on stdout holds %v, want a/b/f and l", names)
		}
	})

	t.Run("errors", func(t *testing.T) {
		out := t.TempDir()
		for _, tc := range []struct {
			name     string
			src, dst string
			want     string
		}{
			{"missing host file", filepath.Join(dir, "nope"), "guest:" + filepath.Join(dir, "x"), "agent cp: open " + filepath.Join(dir, "nope") + ": no such file or directory"},
			{"missing guest file", "guest:" + filepath.Join(dir, "nope"), filepath.Join(out, "x"), "agent cp: guest:" + filepath.Join(dir, "nope") + ": no such file or directory"},
			{"missing guest directory to stdout", "guest:" + filepath.Join(dir, "nope") + "/", "-", "no such file or directory"},
			{"missing host directory", "guest:" + gsrc, filepath.Join(out, "no", "x"), "agent cp: destination " + filepath.Join(out, "no", "x")},
			{"guest parent a file", src, "guest:" + filepath.Join(gsrc, "x"), "agent cp: guest:" + filepath.Join(gsrc, "x") + ": not a directory"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				wantError(t, 1, []string{"agent", "cp", "--uds", uds, tc.src, tc.dst}, tc.want)
			})
		}
		wantEntries(t, out) // no temporary file left behind
	})
}

// wantEntries checks that dir holds exactly the names given.
func wantEntries(t *testing.T, dir string, names ...string) {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range ents {
		got = append(got, e.Name())
	}
	if strings.Join(got, " ") != strings.Join(names, " ") {
		t.Errorf("%s holds %q, want %q", dir, got, names)
	}
}

// TestAgentUsage: command line mistakes exit 2 with one line and dial
// nothing (the socket does not exist).
func TestAgentUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"agent"}, "want a subcommand"},
		{[]string{"agent", "frob"}, `unknown subcommand "frob"`},
		{[]string{"agent", "exec", "--", "true"}, "agent exec: --uds PATH is required"},
		{[]string{"agent", "exec", "--uds", "/nonexistent.sock"}, "agent exec: no command given"},
		{[]string{"agent", "exec", "--uds", "/nonexistent.sock", "--port", "4294967295", "--", "true"}, "--port 4294967295"},
		{[]string{"agent", "exec", "--uds", "/nonexistent.sock", "--env", "=x", "--", "true"}, "want K=V"},
		{[]string{"agent", "exec", "--uds", "/nonexistent.sock", "--workdir", "tmp", "--", "true"}, "absolute guest path"},
		{[]string{"agent", "exec", "--uds", "/nonexistent.sock", "--timeout", "-1s", "--", "true"}, "--timeout -1s"},
		{[]string{"agent", "exec", "--uds", "/nonexistent.sock", "--bogus", "--", "true"}, "flag provided but not defined: -bogus"},
		{[]string{"agent", "cp", "a", "guest:/b"}, "agent cp: --uds PATH is required"},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "a", "b"}, "exactly one of SRC"},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "guest:/a", "guest:/b"}, "exactly one of SRC"},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "a"}, "want SRC and DST"},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "a", "b", "c"}, "want SRC and DST"},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "a", "guest:rel"}, `guest path "rel" must be absolute`},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "", "guest:/a"}, "empty host path"},
		{[]string{"agent", "cp", "--uds", "/nonexistent.sock", "-", "guest:/dir/"}, "name the guest file"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) { wantError(t, 2, tc.args, tc.want) })
	}
}

// TestInitramfsCommand writes an exec image with a stand-in agent (a tiny
// static ELF that only exits) and lists it with cpio.
func TestInitramfsCommand(t *testing.T) {
	dir := t.TempDir()
	agentBin := filepath.Join(dir, "agent")
	if err := os.WriteFile(agentBin, testenv.TinyELF(testenv.Program{}.Exit(0)), 0o755); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	if err := os.WriteFile(data, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	out := filepath.Join(outDir, "exec.cpio")
	base := []string{"initramfs", "--agent", agentBin, "--busybox", ""}

	status, stdout, stderr := runMain(t, append(base, "-o", out, "--add", data+":/srv/data")...)
	if status != 0 || stdout != "" || stderr != "" {
		t.Fatalf("status %d stdout %q stderr %q; want 0 and nothing", status, stdout, stderr)
	}
	wantEntries(t, outDir, "exec.cpio")
	if cpio, err := exec.LookPath("cpio"); err != nil {
		t.Logf("no cpio to list the archive: %v", err)
	} else {
		f, err := os.Open(out)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		cmd := exec.Command(cpio, "-it")
		cmd.Stdin = f
		list, err := cmd.Output()
		if err != nil {
			t.Fatalf("cpio -it: %v", err)
		}
		names := " " + strings.Join(strings.Fields(string(list)), " ") + " "
		for _, want := range []string{"init", "srv/data", "dev/console"} {
			if !strings.Contains(names, " "+want+" ") {
				t.Errorf("the archive lacks %s; it holds%s", want, names)
			}
		}
	}

	t.Run("errors", func(t *testing.T) {
		for _, tc := range []struct {
			name   string
			args   []string
			status int
			want   string
		}{
			{"no -o", base, 2, "initramfs: -o OUT is required"},
			{"argument", append(base, "-o", out, "extra"), 2, `unexpected argument "extra"`},
			{"bad --add", append(base, "-o", out, "--add", "nocolon"), 2, "want SRC:DST"},
			{"missing directory", append(base, "-o", filepath.Join(outDir, "no", "x")), 1, "initramfs: -o " + filepath.Join(outDir, "no", "x") + ": stat "},
			{"output a directory", append(base, "-o", outDir), 1, "is a directory"},
			{"missing agent", []string{"initramfs", "--agent", filepath.Join(dir, "nope"), "--busybox", "", "-o", filepath.Join(outDir, "y")}, 1, "no such file or directory"},
			{"missing --add source", append(base, "-o", filepath.Join(outDir, "y"), "--add", filepath.Join(dir, "nope")+":/x"), 1, "no such file or directory"},
		} {
			t.Run(tc.name, func(t *testing.T) { wantError(t, tc.status, tc.args, tc.want) })
		}
		wantEntries(t, outDir, "exec.cpio") // no y, no y.tmp
	})
}

// TestAgentCpStripsSetuid: a setuid file and a setgid directory copied out
// of the guest arrive without their 07000 bits, unless --keep-setuid; a
// directory copied out to a new path gets the guest directory's mode, and
// one merged into an existing directory leaves that directory's mode alone.
func TestAgentCpStripsSetuid(t *testing.T) {
	uds := startAgent(t)
	guest := t.TempDir()
	suid := filepath.Join(guest, "suid")
	if err := os.WriteFile(suid, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(suid, 0o755|fs.ModeSetuid); err != nil {
		t.Fatal(err)
	}
	tree := filepath.Join(guest, "tree")
	if err := os.Mkdir(tree, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(tree, 0o777|fs.ModeSetgid|fs.ModeSticky); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(suid, filepath.Join(tree, "suid")); err != nil {
		t.Fatal(err)
	}
	mode := func(p string) fs.FileMode {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Mode() & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	}
	for _, keep := range []bool{false, true} {
		out := t.TempDir()
		args := []string{"agent", "cp", "--uds", uds}
		if keep {
			args = append(args, "--keep-setuid")
		}
		if st, so, se := runMainIn(t, nil, append(args, "guest:"+suid, filepath.Join(out, "f"))...); st != 0 {
			t.Fatalf("cp file: status %d %q %q", st, so, se)
		}
		if st, so, se := runMainIn(t, nil, append(args, "guest:"+tree, filepath.Join(out, "new"))...); st != 0 {
			t.Fatalf("cp new dir: status %d %q %q", st, so, se)
		}
		existing := filepath.Join(out, "existing")
		if err := os.Mkdir(existing, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(existing, 0o700); err != nil {
			t.Fatal(err)
		}
		// DST/tree exists: the guest tree is merged into it.
		if err := os.Mkdir(filepath.Join(existing, "tree"), 0o700); err != nil {
			t.Fatal(err)
		}
		if st, so, se := runMainIn(t, nil, append(args, "guest:"+tree, existing)...); st != 0 {
			t.Fatalf("cp into existing: status %d %q %q", st, so, se)
		}
		wantFile, wantDir := fs.FileMode(0o755), fs.FileMode(0o777)
		if keep {
			wantFile, wantDir = wantFile|fs.ModeSetuid, wantDir|fs.ModeSetgid|fs.ModeSticky
		}
		for p, want := range map[string]fs.FileMode{
			filepath.Join(out, "f"): wantFile, filepath.Join(out, "new", "suid"): wantFile,
			filepath.Join(out, "new"): wantDir, filepath.Join(existing, "tree", "suid"): wantFile,
			filepath.Join(existing, "tree"): 0o700,
		} {
			if got := mode(p); got != want {
				t.Errorf("--keep-setuid=%v: %s mode %v, want %v", keep, p, got, want)
			}
		}
		wantEntries(t, out, "existing", "f", "new") // no temporary left
	}
}
