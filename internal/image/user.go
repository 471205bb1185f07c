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

	if n, ok := number(userPart); ok {
		uid = n
		e, err := findEntry(root, "etc/passwd", 2, userPart)
		if err != nil {
			return 0, 0, err
		}
		if e != nil {
			gid, _ = number(e[3])
		}
	} else {
		e, err := findEntry(root, "etc/passwd", 0, userPart)
		if err != nil {
			return 0, 0, err
		}
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
	e, err := findEntry(root, "etc/group", 0, groupPart)
	if err != nil {
		return 0, 0, err
	}
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

// dbLineMax bounds one line of passwd or group: a line is held in memory
// while it is looked at, and real lines are well under 1 KiB.
const dbLineMax = 64 << 10

// findEntry returns the first entry of a colon-separated database
// (passwd, group) in the image whose field i is v; nil when there is
// none, or no such file. The file is read a line at a time, never whole:
// the image chose its size.
func findEntry(root *os.Root, name string, i int, v string) ([]string, error) {
	f, err := root.Open(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the image's /%s: %w", name, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, dbLineMax)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 || line[0] == '#' {
			continue
		}
		// passwd has 7 fields, group 4; a line with fewer is skipped.
		// Lines are split only once one matches: the others cost no
		// allocation, however many there are.
		if bytes.Count(line, []byte(":")) < 3 || !bytes.Equal(field(line, i), []byte(v)) {
			continue
		}
		return strings.Split(string(line), ":"), nil
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, fmt.Errorf("read the image's /%s: a line longer than %d bytes", name, dbLineMax)
		}
		return nil, fmt.Errorf("read the image's /%s: %w", name, err)
	}
	return nil, nil
}

// field is the colon-separated field i of line (nil past the last).
func field(line []byte, i int) []byte {
	for ; i > 0; i-- {
		_, rest, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			return nil
		}
		line = rest
	}
	f, _, _ := bytes.Cut(line, []byte(":"))
	return f
}
