package image

import (
	"os"
	"path/filepath"
	"testing"
)

func TestResolveUser(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "etc"), 0o755)
	os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("# comment\n"+passwd+"odd:x:70000:42::/:/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "etc/group"), []byte(group+"wheel:x:10:app\n"), 0o644)
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()

	good := map[string][2]uint32{
		"":            {0, 0},
		"root":        {0, 0},
		"nobody":      {65534, 65534},
		"app":         {1000, 1000},
		"odd":         {70000, 42},
		"1000":        {1000, 1000}, // gid from the passwd entry
		"4242":        {4242, 0},    // no entry: gid 0
		"app:wheel":   {1000, 10},
		"app:7":       {1000, 7},
		"4242:wheel":  {4242, 10},
		"12:34":       {12, 34},
		"nobody:root": {65534, 0},
	}
	for user, want := range good {
		uid, gid, err := resolveUser(root, user)
		if err != nil || uid != want[0] || gid != want[1] {
			t.Errorf("resolveUser(%q) = %d:%d %v, want %d:%d", user, uid, gid, err, want[0], want[1])
		}
	}
	for _, user := range []string{"ghost", "app:ghosts", ":1", "1:", "-1", "99999999999"} {
		if uid, gid, err := resolveUser(root, user); err == nil {
			t.Errorf("resolveUser(%q) = %d:%d, want an error", user, uid, gid)
		}
	}

	// An image without /etc/passwd takes numbers only.
	empty, err := os.OpenRoot(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer empty.Close()
	if uid, gid, err := resolveUser(empty, "5:6"); err != nil || uid != 5 || gid != 6 {
		t.Errorf("5:6 without passwd = %d:%d %v", uid, gid, err)
	}
	if _, _, err := resolveUser(empty, "nobody"); err == nil {
		t.Error("a name resolved without /etc/passwd")
	}
}
