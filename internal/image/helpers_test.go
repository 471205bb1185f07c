package image

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/microvm/microvm/internal/testing/testimage"
)

// anonymous is a keychain that never reads docker's config: tests must not
// depend on this machine's credentials.
var anonymous = authn.NewMultiKeychain()

func testOptions() Options {
	return Options{Keychain: anonymous}
}

// fakeRegistry serves an in-memory registry on 127.0.0.1 (plain http, as
// go-containerregistry uses for loopback registries). wrap, when set, sits
// in front of it.
func fakeRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithAuth(authn.Anonymous)); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func pushIndex(t *testing.T, ref string, idx v1.ImageIndex) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(r, idx, remote.WithAuth(authn.Anonymous)); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// entry is one member of a hand-built layer.
type entry struct {
	name     string
	typ      byte
	mode     int64
	uid, gid int
	body     string // content, or link target
	xattrs   map[string]string
	mtime    time.Time
}

var testTime = time.Date(2021, 3, 4, 5, 6, 7, 0, time.UTC)

func dir(n string, mode int64) entry {
	return entry{name: n, typ: tar.TypeDir, mode: mode}
}

func file(n, body string) entry {
	return entry{name: n, typ: tar.TypeReg, mode: 0o644, body: body}
}

func symlink(n, target string) entry {
	return entry{name: n, typ: tar.TypeSymlink, mode: 0o777, body: target}
}

func hardlink(n, target string) entry {
	return entry{name: n, typ: tar.TypeLink, mode: 0o644, body: target}
}

func tarBytes(t testing.TB, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		mt := e.mtime
		if mt.IsZero() {
			mt = testTime
		}
		h := &tar.Header{
			Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid,
			ModTime: mt, Format: tar.FormatPAX,
		}
		switch e.typ {
		case tar.TypeReg:
			h.Size = int64(len(e.body))
		case tar.TypeSymlink, tar.TypeLink:
			h.Linkname = e.body
		case tar.TypeChar, tar.TypeBlock:
			h.Devmajor, h.Devminor = 1, 3
		}
		for k, v := range e.xattrs {
			if h.PAXRecords == nil {
				h.PAXRecords = map[string]string{}
			}
			h.PAXRecords[xattrPAXPrefix+k] = v
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			if _, err := tw.Write([]byte(e.body)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layer(t testing.TB, entries ...entry) v1.Layer {
	t.Helper()
	return testimage.FromTar(t, tarBytes(t, entries))
}

// imageOf builds an image of layers with the given config.
func imageOf(t testing.TB, cfg v1.Config, arch string, layers ...v1.Layer) v1.Image {
	t.Helper()
	return testimage.Of(t, cfg, arch, layers...)
}

// debugfs runs one read-only debugfs request on an ext4 file.
func debugfs(t *testing.T, img, request string) string {
	t.Helper()
	tool, err := findTool("debugfs")
	if err != nil {
		t.Skip(err)
	}
	out, err := exec.Command(tool, "-R", request, img).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs -R %q: %v\n%s", request, err, out)
	}
	return string(out)
}

type inodeStat struct {
	found    bool
	inode    int
	mode     int64 // permission bits as debugfs shows them (octal)
	uid, gid int
	typ      string
	text     string
}

var (
	reInode = regexp.MustCompile(`Inode: (\d+)\s+Type: (\S+)\s+Mode:\s+(\d+)`)
	reOwner = regexp.MustCompile(`User:\s+(\d+)\s+Group:\s+(\d+)`)
)

func statPath(t *testing.T, img, p string) inodeStat {
	t.Helper()
	out := debugfs(t, img, "stat "+quoted(t, p))
	m := reInode.FindStringSubmatch(out)
	if m == nil {
		return inodeStat{text: out}
	}
	o := reOwner.FindStringSubmatch(out)
	if o == nil {
		t.Fatalf("stat %s: no owner in %s", p, out)
	}
	st := inodeStat{found: true, typ: m[2], text: out}
	st.inode, _ = strconv.Atoi(m[1])
	st.mode, _ = strconv.ParseInt(m[3], 8, 64)
	st.uid, _ = strconv.Atoi(o[1])
	st.gid, _ = strconv.Atoi(o[2])
	return st
}

func catPath(t *testing.T, img, p string) string {
	t.Helper()
	out := debugfs(t, img, "cat "+quoted(t, p))
	// The banner goes first, on stderr.
	if i := strings.Index(out, ")\n"); i >= 0 && strings.HasPrefix(out, "debugfs ") {
		out = out[i+2:]
	}
	return out
}

func quoted(t *testing.T, p string) string {
	t.Helper()
	q, ok := debugfsQuote(p)
	if !ok {
		t.Fatalf("debugfs cannot take %q", p)
	}
	return q
}

// fsck checks an ext4 file is consistent.
func fsck(t *testing.T, img string) {
	t.Helper()
	tool, err := findTool("e2fsck")
	if err != nil {
		t.Skip(err)
	}
	if out, err := exec.Command(tool, "-fn", img).CombinedOutput(); err != nil {
		t.Fatalf("e2fsck -fn %s: %v\n%s", img, err, out)
	}
}

// tmpEmpty fails unless the store's tmp/ is empty.
func tmpEmpty(t *testing.T, s *Store) {
	t.Helper()
	entries, err := os.ReadDir(s.path(tmpDir))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("left in tmp/: %s", e.Name())
	}
}

func noImages(t *testing.T, s *Store) {
	t.Helper()
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 0 {
		t.Errorf("List = %v, want nothing", list)
	}
	ids, err := s.imageIDs()
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 0 {
		t.Errorf("images/ holds %v", ids)
	}
	tmpEmpty(t, s)
}

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// progressLog records Progress callbacks.
type progressLog struct {
	mu sync.Mutex
	ev []Progress
}

func (p *progressLog) add(ev Progress) {
	p.mu.Lock()
	p.ev = append(p.ev, ev)
	p.mu.Unlock()
}

func (p *progressLog) events() []Progress {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Progress(nil), p.ev...)
}

func (p *progressLog) phase(ph string) []Progress {
	var out []Progress
	for _, e := range p.events() {
		if e.Phase == ph {
			out = append(out, e)
		}
	}
	return out
}
