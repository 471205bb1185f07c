package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

const (
	passwd = "root:x:0:0:root:/root:/bin/sh\n" +
		"app:x:1000:1000:app:/home/app:/bin/sh\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	group = "root:x:0:\napp:x:1000:\nnogroup:x:65534:\n"
)

// sampleImage has three layers exercising what conversion must keep and
// drop.
func sampleImage(t testing.TB, user string) v1.Image {
	t.Helper()
	owned := file("home/app/notes.txt", "mine")
	owned.uid, owned.gid, owned.mode = 1000, 1000, 0o640
	home := dir("home/app", 0o750)
	home.uid, home.gid = 1000, 1000
	suid := file("usr/bin/tool", "#!/bin/sh\necho tool\n")
	suid.mode = 0o4755
	null := entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666}
	base := layer(t,
		dir("etc", 0o755),
		file("etc/passwd", passwd),
		file("etc/group", group),
		dir("usr", 0o755), dir("usr/bin", 0o755),
		suid,
		dir("data", 0o755),
		file("data/deleted.txt", "bye"),
		file("data/kept.txt", "kept"),
		dir("opq", 0o755),
		file("opq/lower.txt", "lower"),
		dir("home", 0o755), home, owned,
		dir("dev", 0o755), null,
		dir("lib", 0o755),
		file("lib/target.txt", "target content"),
	)

	capFile := file("usr/bin/pinger", "ping")
	capFile.xattrs = map[string]string{"user.test": "hello", "security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}
	mid := layer(t,
		dir("data", 0o755),
		file("data/.wh.deleted.txt", ""),
		dir("opq", 0o755),
		file("opq/.wh..wh..opq", ""),
		file("opq/upper.txt", "upper"),
		dir("usr/bin", 0o755),
		file("usr/bin/a", "same inode"),
		hardlink("usr/bin/b", "usr/bin/a"),
		capFile,
		dir("lib", 0o755),
		symlink("lib/sym", "target.txt"),
		hardlink("lib/hl", "lib/target.txt"), // target in the layer below
	)

	odd := file(`odd/a "quoted" name.txt`, "odd")
	odd.uid, odd.gid = 1234, 4321
	ro := dir("ro", 0o555)
	ro.mtime = time.Date(2019, 1, 2, 3, 4, 5, 0, time.UTC)
	sticky := dir("tmp", 0o1777)
	top := layer(t,
		dir("odd", 0o755), odd,
		ro, file("ro/inside.txt", "inside"),
		sticky,
	)
	return imageOf(t, v1.Config{
		User:       user,
		Env:        []string{"PATH=/usr/bin:/bin", "HOME=/root"},
		WorkingDir: "/data",
		Entrypoint: []string{"/usr/bin/tool"},
		Cmd:        []string{"--help"},
	}, "amd64", base, mid, top)
}

func TestPullConverts(t *testing.T) {
	reg := fakeRegistry(t, nil)
	img := sampleImage(t, "nobody")
	ref := reg + "/test/sample:v1"
	push(t, ref, img)

	s := openStore(t)
	var pl progressLog
	o := testOptions()
	o.Progress = pl.add
	var warnings []string
	o.Logf = func(f string, a ...any) { warnings = append(warnings, fmt.Sprintf(f, a...)) }
	im, err := s.Pull(context.Background(), ref, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("warnings: %q", warnings)

	cfgName, _ := img.ConfigName()
	digest, _ := img.Digest()
	if im.ID != cfgName.Hex || im.Digest != digest.String() {
		t.Errorf("ID %s digest %s, want %s %s", im.ID, im.Digest, cfgName.Hex, digest)
	}
	if len(im.Refs) != 1 || im.Refs[0] != ref {
		t.Errorf("Refs = %v, want [%s]", im.Refs, ref)
	}
	if im.Platform != "linux/amd64" {
		t.Errorf("Platform = %q", im.Platform)
	}
	if im.Skipped != 1 {
		t.Errorf("Skipped = %d, want 1 (dev/null)", im.Skipped)
	}
	if im.Config.User != "nobody" || im.Config.UID != 65534 || im.Config.GID != 65534 {
		t.Errorf("Config user %q %d:%d, want nobody 65534:65534", im.Config.User, im.Config.UID, im.Config.GID)
	}
	if im.Config.WorkingDir != "/data" || len(im.Config.Env) != 2 || im.Config.Entrypoint[0] != "/usr/bin/tool" || im.Config.Cmd[0] != "--help" {
		t.Errorf("Config = %+v", im.Config)
	}
	fi, err := os.Stat(im.Rootfs)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o444 || fi.Size() != im.Size || !filepath.IsAbs(im.Rootfs) {
		t.Errorf("rootfs %s: mode %v size %d (Size %d)", im.Rootfs, fi.Mode(), fi.Size(), im.Size)
	}
	if im.ContentBytes == 0 || im.ContentBytes > 1000 {
		t.Errorf("ContentBytes = %d", im.ContentBytes)
	}
	tmpEmpty(t, s)
	fsck(t, im.Rootfs)
	checkSample(t, im.Rootfs)

	// Progress: download bytes up to the layers' total, then two convert
	// steps.
	m, _ := img.Manifest()
	var total int64
	for _, l := range m.Layers {
		total += l.Size
	}
	dl := pl.phase(PhaseDownload)
	if len(dl) == 0 {
		t.Fatal("no download progress")
	}
	last := dl[len(dl)-1]
	if last.Total != total || last.Done != total {
		t.Errorf("last download progress %+v, want %d of %d", last, total, total)
	}
	for i := 1; i < len(dl); i++ {
		if dl[i].Done < dl[i-1].Done {
			t.Errorf("download progress goes back: %+v", dl)
		}
	}
	if cv := pl.phase(PhaseConvert); len(cv) != 3 || cv[2].Done != 2 || cv[2].Total != 2 {
		t.Errorf("convert progress = %+v", cv)
	}
}

// checkSample checks sampleImage's content in an ext4 file.
func checkSample(t *testing.T, rootfs string) {
	t.Helper()
	if got := catPath(t, rootfs, "/data/kept.txt"); got != "kept" {
		t.Errorf("/data/kept.txt = %q", got)
	}
	for _, gone := range []string{"/data/deleted.txt", "/opq/lower.txt", "/dev/null"} {
		if st := statPath(t, rootfs, gone); st.found {
			t.Errorf("%s is in the image:\n%s", gone, st.text)
		}
	}
	if got := catPath(t, rootfs, "/opq/upper.txt"); got != "upper" {
		t.Errorf("/opq/upper.txt = %q", got)
	}
	a, b := statPath(t, rootfs, "/usr/bin/a"), statPath(t, rootfs, "/usr/bin/b")
	if !a.found || a.inode != b.inode {
		t.Errorf("hard link: a inode %d, b inode %d", a.inode, b.inode)
	}
	tg, hl := statPath(t, rootfs, "/lib/target.txt"), statPath(t, rootfs, "/lib/hl")
	if !tg.found || tg.inode != hl.inode {
		t.Errorf("hard link across layers: target inode %d, link inode %d", tg.inode, hl.inode)
	}
	sym := statPath(t, rootfs, "/lib/sym")
	if sym.typ != "symlink" || !strings.Contains(sym.text, `Fast link dest: "target.txt"`) {
		t.Errorf("/lib/sym:\n%s", sym.text)
	}
	if st := statPath(t, rootfs, "/usr/bin/tool"); st.mode != 0o4755 || st.uid != 0 {
		t.Errorf("/usr/bin/tool mode %o uid %d, want 4755 0", st.mode, st.uid)
	}
	if st := statPath(t, rootfs, "/home/app/notes.txt"); st.uid != 1000 || st.gid != 1000 || st.mode != 0o640 {
		t.Errorf("/home/app/notes.txt %d:%d %o, want 1000:1000 640", st.uid, st.gid, st.mode)
	}
	if st := statPath(t, rootfs, "/home/app"); st.uid != 1000 || st.mode != 0o750 {
		t.Errorf("/home/app %d %o, want 1000 750", st.uid, st.mode)
	}
	if st := statPath(t, rootfs, `/odd/a "quoted" name.txt`); st.uid != 1234 || st.gid != 4321 {
		t.Errorf("odd name %d:%d, want 1234:4321\n%s", st.uid, st.gid, st.text)
	}
	ro := statPath(t, rootfs, "/ro")
	if ro.mode != 0o555 || !strings.Contains(ro.text, "2019") {
		t.Errorf("/ro mode %o, want 555 and a 2019 mtime:\n%s", ro.mode, ro.text)
	}
	if got := catPath(t, rootfs, "/ro/inside.txt"); got != "inside" {
		t.Errorf("/ro/inside.txt = %q", got)
	}
	if st := statPath(t, rootfs, "/tmp"); st.mode != 0o1777 {
		t.Errorf("/tmp mode %o, want 1777", st.mode)
	}
	if st := statPath(t, rootfs, "/"); st.mode != 0o755 || st.uid != 0 || st.gid != 0 {
		t.Errorf("/ %d:%d %o, want 0:0 755", st.uid, st.gid, st.mode)
	}
	ea := debugfs(t, rootfs, "ea_list /usr/bin/pinger")
	if !strings.Contains(ea, `user.test (5) = "hello"`) || !strings.Contains(ea, "security.capability") {
		t.Errorf("xattrs of /usr/bin/pinger:\n%s", ea)
	}
	if st := statPath(t, rootfs, "/data/kept.txt"); !strings.Contains(st.text, "2021") {
		t.Errorf("/data/kept.txt lost its mtime:\n%s", st.text)
	}
}

func TestPullSecondNameDoesNotConvert(t *testing.T) {
	reg := fakeRegistry(t, nil)
	img := sampleImage(t, "")
	push(t, reg+"/test/one:latest", img)
	push(t, reg+"/test/two:latest", img)

	s := openStore(t)
	first, err := s.Pull(context.Background(), reg+"/test/one", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(first.Rootfs)

	var pl progressLog
	o := testOptions()
	o.Progress = pl.add
	second, err := s.Pull(context.Background(), reg+"/test/two:latest", o)
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != first.ID || second.Rootfs != first.Rootfs {
		t.Errorf("second pull: %s %s, want %s %s", second.ID, second.Rootfs, first.ID, first.Rootfs)
	}
	if ev := pl.events(); len(ev) != 0 {
		t.Errorf("second pull converted again: progress %+v", ev)
	}
	after, _ := os.Stat(first.Rootfs)
	if !os.SameFile(before, after) {
		t.Error("rootfs replaced")
	}
	want := []string{reg + "/test/one:latest", reg + "/test/two:latest"}
	if fmt.Sprint(second.Refs) != fmt.Sprint(want) {
		t.Errorf("Refs = %v, want %v", second.Refs, want)
	}
	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 1 || fmt.Sprint(list[0].Refs) != fmt.Sprint(want) {
		t.Errorf("List = %+v", list)
	}
	if first.Config.UID != 0 || first.Config.GID != 0 {
		t.Errorf("user \"\" = %d:%d, want 0:0", first.Config.UID, first.Config.GID)
	}
}

func TestPullIndexPicksPlatform(t *testing.T) {
	reg := fakeRegistry(t, nil)
	mk := func(arch, variant, marker string) v1.Image {
		img := imageOf(t, v1.Config{}, arch, layer(t, file("arch.txt", marker)))
		if variant != "" {
			cf, _ := img.ConfigFile()
			cf = cf.DeepCopy()
			cf.Variant = variant
			img, _ = mutate.ConfigFile(img, cf)
		}
		return img
	}
	amd, arm, armv7 := mk("amd64", "", "amd64"), mk("arm64", "", "arm64"), mk("arm", "v7", "armv7")
	add := func(img v1.Image, arch, variant string) mutate.IndexAddendum {
		return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: "linux", Architecture: arch, Variant: variant},
		}}
	}
	pushIndex(t, reg+"/test/multi:1", mutate.AppendManifests(empty.Index,
		add(arm, "arm64", "v8"), add(amd, "amd64", ""), add(armv7, "arm", "v7")))
	pushIndex(t, reg+"/test/noamd:1", mutate.AppendManifests(empty.Index,
		add(arm, "arm64", "v8"), add(armv7, "arm", "v7")))

	s := openStore(t)
	im, err := s.Pull(context.Background(), reg+"/test/multi:1", testOptions())
	if err != nil {
		t.Fatal(err)
	}
	amdID, _ := amd.ConfigName()
	if im.ID != amdID.Hex || im.Platform != "linux/amd64" {
		t.Errorf("picked %s %s, want amd64's %s", im.ID, im.Platform, amdID.Hex)
	}
	if got := catPath(t, im.Rootfs, "/arch.txt"); got != "amd64" {
		t.Errorf("/arch.txt = %q", got)
	}

	o := testOptions()
	o.Platform = "linux/arm64"
	im, err = s.Pull(context.Background(), reg+"/test/multi:1", o)
	if err != nil {
		t.Fatal(err)
	}
	if got := catPath(t, im.Rootfs, "/arch.txt"); got != "arm64" || im.Platform != "linux/arm64" {
		t.Errorf("linux/arm64: /arch.txt = %q, platform %s", got, im.Platform)
	}

	_, err = s.Pull(context.Background(), reg+"/test/noamd:1", testOptions())
	if err == nil {
		t.Fatal("pull of an index without linux/amd64 succeeded")
	}
	for _, want := range []string{"linux/amd64", "linux/arm64/v8", "linux/arm/v7"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
	tmpEmpty(t, s)
}

func TestPullSingleImageOtherPlatform(t *testing.T) {
	reg := fakeRegistry(t, nil)
	push(t, reg+"/test/arm:1", imageOf(t, v1.Config{}, "arm64", layer(t, file("x", "x"))))
	s := openStore(t)
	_, err := s.Pull(context.Background(), reg+"/test/arm:1", testOptions())
	if err == nil || !strings.Contains(err.Error(), "linux/arm64") {
		t.Fatalf("err = %v, want one naming linux/arm64", err)
	}
	noImages(t, s)
}

// blobPath says whether r fetches the blob d.
func blobPath(r *http.Request, d v1.Hash) bool {
	return r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+d.String())
}

func TestPullDigestMismatch(t *testing.T) {
	img := sampleImage(t, "")
	layers, _ := img.Layers()
	bad, _ := layers[1].Digest()
	reg := fakeRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !blobPath(r, bad) {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			body[len(body)/2] ^= 0xff // same length, other bytes
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(body)
		})
	})
	push(t, reg+"/test/bad:1", img)

	s := openStore(t)
	_, err := s.Pull(context.Background(), reg+"/test/bad:1", testOptions())
	if !errors.Is(err, ErrDigest) {
		t.Fatalf("err = %v, want ErrDigest", err)
	}
	t.Log(err)
	noImages(t, s)
}

func TestPullDiffIDMismatch(t *testing.T) {
	// The blob matches its digest but not the config's diff_id.
	good := layer(t, file("a", "a"))
	other := layer(t, file("a", "b"))
	img := imageOf(t, v1.Config{}, "amd64", good)
	otherDiff, _ := other.DiffID()
	cf, _ := img.ConfigFile()
	cf = cf.DeepCopy()
	cf.RootFS.DiffIDs[0] = otherDiff
	img, err := mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	reg := fakeRegistry(t, nil)
	push(t, reg+"/test/diff:1", img)
	s := openStore(t)
	_, err = s.Pull(context.Background(), reg+"/test/diff:1", testOptions())
	if !errors.Is(err, ErrDigest) {
		t.Fatalf("err = %v, want ErrDigest", err)
	}
	noImages(t, s)
}

// bigImage has one layer of about 4 MiB of random bytes.
func bigImage(t *testing.T) (v1.Image, v1.Hash) {
	t.Helper()
	l, err := random.Layer(4<<20, types.DockerLayer)
	if err != nil {
		t.Fatal(err)
	}
	img := imageOf(t, v1.Config{}, "amd64", l)
	d, _ := l.Digest()
	return img, d
}

func TestPullInterrupted(t *testing.T) {
	img, big := bigImage(t)
	reg := fakeRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !blobPath(r, big) {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			w.Write(body[:len(body)/2])
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler) // cut the connection mid-blob
		})
	})
	push(t, reg+"/test/big:1", img)

	s := openStore(t)
	_, err := s.Pull(context.Background(), reg+"/test/big:1", testOptions())
	if err == nil {
		t.Fatal("pull of a cut-off blob succeeded")
	}
	if errors.Is(err, ErrDigest) {
		t.Errorf("a cut-off download reported as a digest mismatch: %v", err)
	}
	t.Log(err)
	noImages(t, s)
}

func TestPullCancel(t *testing.T) {
	img, big := bigImage(t)
	reg := fakeRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !blobPath(r, big) {
				h.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, r)
			body := rec.Body.Bytes()
			w.Header().Set("Content-Length", fmt.Sprint(len(body)))
			w.WriteHeader(http.StatusOK)
			w.Write(body[:len(body)/2])
			w.(http.Flusher).Flush()
			<-r.Context().Done() // stall until the client goes
		})
	})
	push(t, reg+"/test/slow:1", img)

	s := openStore(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	o := testOptions()
	started := make(chan struct{})
	var once bool
	o.Progress = func(p Progress) {
		if p.Phase == PhaseDownload && p.Done > 0 && !once {
			once = true
			close(started)
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := s.Pull(ctx, reg+"/test/slow:1", o)
		errc <- err
	}()
	select {
	case <-started:
	case err := <-errc:
		t.Fatalf("pull ended before the download stalled: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("download never started")
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("pull did not stop after cancel")
	}
	noImages(t, s)
}

func TestPullAuthRequired(t *testing.T) {
	reg := fakeRegistry(t, func(http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
		})
	})
	s := openStore(t)
	_, err := s.Pull(context.Background(), reg+"/private/app:1", testOptions())
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("err = %v, want ErrAuth", err)
	}
	if !strings.Contains(err.Error(), "docker login "+reg) || !strings.Contains(err.Error(), "DOCKER_CONFIG") {
		t.Errorf("error does not say how to log in: %v", err)
	}
	noImages(t, s)
}

func TestPullNotFound(t *testing.T) {
	reg := fakeRegistry(t, nil)
	s := openStore(t)
	_, err := s.Pull(context.Background(), reg+"/test/missing:1", testOptions())
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	noImages(t, s)
}

func TestPullUnsafePath(t *testing.T) {
	top := t.TempDir()
	reg := fakeRegistry(t, nil)
	img := imageOf(t, v1.Config{}, "amd64",
		layer(t, file("ok.txt", "ok")),
		layer(t, file("../escape", "out"), file("../../../../escape", "out")))
	push(t, reg+"/test/escape:1", img)

	s, err := Open(filepath.Join(top, "store"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.Pull(context.Background(), reg+"/test/escape:1", testOptions())
	if err == nil || !strings.Contains(err.Error(), "unsafe tar path") {
		t.Fatalf("err = %v, want an unsafe tar path error", err)
	}
	filepath.Walk(top, func(p string, fi os.FileInfo, err error) error {
		if fi != nil && fi.Name() == "escape" {
			t.Errorf("written outside staging: %s", p)
		}
		return nil
	})
	noImages(t, s)
}
