package kernel

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/microvm/microvm/internal/testing/testenv"
)

// The artefact cache that build.sh stores kernels in
// (scripts/lib/artefact-cache.sh, docs/testing.md "The artefact cache"),
// driven through bash as build.sh drives it. Each case is a fault the
// issue names: a corrupt entry, a half-written one, a cache that cannot be
// written, a full disk, two runs storing one key at once. Each must give at
// most one clear line and a build, never a wrong artefact.

// cacheShell runs script in bash with the library sourced and the cache
// at dir, under the command wrap when given (unshare -rm); it returns
// stdout, stderr and the exit status.
func cacheShell(t *testing.T, dir, script string, wrap ...string) (stdout, stderr string, status int) {
	t.Helper()
	lib := cacheLib(t)
	argv := slices.Concat(wrap, []string{"bash", "-euo", "pipefail", "-c", ". \"$LIB\"\n" + script})
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), "LIB="+lib, "MICROVM_CACHE_DIR="+dir)
	var o, e strings.Builder
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return o.String(), e.String(), ee.ExitCode()
	} else if err != nil {
		t.Fatalf("bash: %v", err)
	}
	return o.String(), e.String(), 0
}

// cacheLib is the library's path in this repository.
func cacheLib(t *testing.T) string {
	t.Helper()
	root, err := testenv.Root()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, "scripts", "lib", "artefact-cache.sh")
}

// writeArtefact writes a file of n bytes named name in a fresh directory.
func writeArtefact(t *testing.T, name string, n int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(strings.Repeat("k", n)), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// leftovers lists what is in the kind's directory besides the entries named.
func leftovers(t *testing.T, dir string, keep ...string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if !slices.Contains(keep, e.Name()) {
			out = append(out, e.Name())
		}
	}
	return out
}

// wantBuildOneLine checks a read that must fall back to a build: stdout
// is BUILD (and nothing else: no HIT, no leftovers listed) and stderr is
// one line containing line.
func wantBuildOneLine(t *testing.T, what, stdout, stderr, line string) {
	t.Helper()
	if strings.TrimSpace(stdout) != "BUILD" {
		t.Errorf("%s: stdout %q, want BUILD", what, stdout)
	}
	if lines := strings.Split(strings.TrimSpace(stderr), "\n"); len(lines) != 1 || !strings.Contains(lines[0], line) {
		t.Errorf("%s: stderr %q, want one line with %q", what, stderr, line)
	}
}

func TestArtefactCacheRoundTripAndCorruption(t *testing.T) {
	cache := t.TempDir()
	out := filepath.Join(t.TempDir(), "copy")
	t.Setenv("ART", writeArtefact(t, "bzImage", 4096))
	t.Setenv("OUT", out)
	_, errOut, st := cacheShell(t, cache, `artefact_put kernel k1 "$ART"; e=$(artefact_get kernel k1); artefact_copy "$e" bzImage "$OUT"`)
	if st != 0 || !strings.Contains(errOut, "cache: stored kernel/k1") {
		t.Fatalf("put and get: status %d, stderr %q", st, errOut)
	}
	if b, err := os.ReadFile(out); err != nil || len(b) != 4096 {
		t.Fatalf("the copy out of the cache: %d bytes, %v; want 4096", len(b), err)
	}

	// A flipped byte in the stored kernel: the read fails with one line,
	// the entry is gone, and the caller builds.
	entry := filepath.Join(cache, "kernel", "k1")
	if err := os.WriteFile(filepath.Join(entry, "bzImage"), []byte(strings.Repeat("k", 4095)+"x"), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, errOut, _ := cacheShell(t, cache, `if artefact_get kernel k1; then echo HIT; else echo BUILD; fi`)
	wantBuildOneLine(t, "corrupt entry", stdout, errOut, "does not match its SHA256SUMS; removing it and building again")
	if _, err := os.Stat(entry); !os.IsNotExist(err) {
		t.Errorf("corrupt entry still there (%v)", err)
	}
	if l := leftovers(t, filepath.Join(cache, "kernel")); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
}

// A run killed while storing leaves a temporary directory, which is never
// read; an entry without its SHA256SUMS (a damaged one: entries appear by
// a rename with it inside) is removed with one line like a corrupt one, so
// the next store of the key is not blocked by it.
func TestArtefactCacheHalfWritten(t *testing.T) {
	cache := t.TempDir()
	kind := filepath.Join(cache, "kernel")
	for _, d := range []string{".tmp-k2.abc123", "k2"} {
		if err := os.MkdirAll(filepath.Join(kind, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(kind, d, "bzImage"), []byte("half"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	stdout, errOut, _ := cacheShell(t, cache, `if artefact_get kernel k2; then echo HIT; else echo BUILD; fi`)
	wantBuildOneLine(t, "half-written entry", stdout, errOut, "kernel/k2")
	// The store after the build takes the key, and the next read finds it.
	t.Setenv("ART", writeArtefact(t, "bzImage", 100))
	if _, errOut, st := cacheShell(t, cache, `artefact_put kernel k2 "$ART"`); st != 0 || !strings.Contains(errOut, "stored kernel/k2") {
		t.Fatalf("store after a half entry: status %d, stderr %q", st, errOut)
	}
	stdout, _, _ = cacheShell(t, cache, `if e=$(artefact_get kernel k2); then echo "HIT $(wc -c <"$e/bzImage")"; else echo BUILD; fi`)
	if s := strings.TrimSpace(stdout); s != "HIT 100" {
		t.Errorf("after storing: %q, want HIT 100", s)
	}
	// The killed run's temporary directory is a day's grace from removal
	// (a run may still be writing it): it stays, and is never an entry.
	if l := leftovers(t, kind, "k2", ".tmp-k2.abc123"); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
}

// A cache that cannot be written (here its root is a regular file) and one
// whose disk fills while storing: each says so in one line, the caller's
// run goes on (status 0 under set -e), nothing half is left, and the next
// read builds.
func TestArtefactCacheUnwritableAndFull(t *testing.T) {
	t.Setenv("ART", writeArtefact(t, "bzImage", 64<<10))
	file := filepath.Join(t.TempDir(), "not-a-directory")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, st := cacheShell(t, file, `artefact_put kernel k3 "$ART"; echo ran-on`)
	if st != 0 || strings.Count(strings.TrimSpace(errOut), "\n") != 0 || !strings.Contains(errOut, "cannot write") || !strings.Contains(errOut, "not cached") {
		t.Errorf("unwritable cache: status %d, stderr %q; want 0 and one line", st, errOut)
	}

	// A full disk: a 16 KiB tmpfs in a mount namespace of the test's own
	// (unshare -rm: no privileges needed where user namespaces are on).
	if _, err := exec.LookPath("unshare"); err != nil {
		testenv.Missing(t, "unshare (util-linux): %v", err)
		return
	}
	if out, err := exec.Command("unshare", "-rm", "true").CombinedOutput(); err != nil {
		testenv.Missing(t, "a mount namespace for a small tmpfs (unshare -rm): %v: %s", err, out)
		return
	}
	stdout, errOut, st := cacheShell(t, t.TempDir(), `mount -t tmpfs -o size=16k tmpfs "$MICROVM_CACHE_DIR"
artefact_put kernel k4 "$ART"
if artefact_get kernel k4 >/dev/null; then echo HIT; else echo BUILD; fi
ls -A "$MICROVM_CACHE_DIR/kernel" 2>/dev/null | sed 's/^/left: /'`, "unshare", "-rm")
	if st != 0 {
		t.Fatalf("full disk: status %d (the caller's run must go on)\nstdout %q\nstderr %q", st, stdout, errOut)
	}
	wantBuildOneLine(t, "full disk", stdout, errOut, "disk full?")
}

// Two runs storing the same key at once keep one whole entry and leave no
// temporary directory.
func TestArtefactCacheConcurrentStores(t *testing.T) {
	cache := t.TempDir()
	t.Setenv("ART", writeArtefact(t, "bzImage", 1<<20))
	var wg sync.WaitGroup
	errs := make([]string, 4)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, e, st := cacheShell(t, cache, `artefact_put kernel k5 "$ART"`); st != 0 {
				errs[i] = e
			}
		}()
	}
	wg.Wait()
	for i, e := range errs {
		if e != "" {
			t.Errorf("store %d failed: %s", i, e)
		}
	}
	stdout, errOut, _ := cacheShell(t, cache, `if e=$(artefact_get kernel k5); then echo "HIT $(wc -c <"$e/bzImage")"; else echo BUILD; fi`)
	if strings.TrimSpace(stdout) != "HIT 1048576" || errOut != "" {
		t.Errorf("after concurrent stores: %q (stderr %q), want the whole entry", stdout, errOut)
	}
	if l := leftovers(t, filepath.Join(cache, "kernel"), "k5"); len(l) != 0 {
		t.Errorf("left behind: %v", l)
	}
}
