package image

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
)

// resolveUser turns an image config's User ("", "name", "uid",
// "name:group", "uid:gid", "name:gid", "uid:group") into numeric IDs,
// looking names up in the image's own /etc/passwd and /etc/group as they
// are in root. "" is root. A user given by number needs no passwd entry;
// without a group its gid is its passwd entry's, or 0 without one. A name
// that is not found is an error.
func resolveUser(root *os.Root, user string) (uid, gid uint32, err error) {
	if user == "" {
		return 0, 0, nil
	}
	userPart, groupPart, hasGroup := strings.Cut(user, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return 0, 0, fmt.Errorf("user %q: malformed", user)
	}

	passwd, err := readDB(root, "etc/passwd")
	if err != nil {
		return 0, 0, err
	}
	if n, ok := number(userPart); ok {
		uid = n
		if e := findEntry(passwd, 2, userPart); e != nil {
			gid, _ = number(e[3])
		}
	} else {
		e := findEntry(passwd, 0, userPart)
		if e == nil {
			return 0, 0, fmt.Errorf("user %q: no user %q in the image's /etc/passwd", user, userPart)
		}
		var ok1, ok2 bool
		uid, ok1 = number(e[2])
		gid, ok2 = number(e[3])
		if !ok1 || !ok2 {
			return 0, 0, fmt.Errorf("user %q: bad /etc/passwd entry for %q", user, userPart)
		}
	}
	if !hasGroup {
		return uid, gid, nil
	}

	if n, ok := number(groupPart); ok {
		return uid, n, nil
	}
	group, err := readDB(root, "etc/group")
	if err != nil {
		return 0, 0, err
	}
	e := findEntry(group, 0, groupPart)
	if e == nil {
		return 0, 0, fmt.Errorf("user %q: no group %q in the image's /etc/group", user, groupPart)
	}
	gid, ok := number(e[2])
	if !ok {
		return 0, 0, fmt.Errorf("user %q: bad /etc/group entry for %q", user, groupPart)
	}
	return uid, gid, nil
}

func number(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

// readDB reads a colon-separated database (passwd, group) from the image;
// a missing file is an empty one.
func readDB(root *os.Root, name string) ([][]string, error) {
	b, err := root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the image's /%s: %w", name, err)
	}
	var out [][]string
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < 4 {
			continue // passwd has 7 fields, group 4
		}
		out = append(out, f)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read the image's /%s: %w", name, err)
	}
	return out, nil
}

// findEntry returns the first entry whose field i is v.
func findEntry(db [][]string, i int, v string) []string {
	for _, e := range db {
		if e[i] == v {
			return e
		}
	}
	return nil
}
