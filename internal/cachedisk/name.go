package cachedisk

import (
	"fmt"
	"strings"
)

// maxName bounds a cache name: callers key names per project
// ("project-12-go"), and a name is a directory name.
const maxName = 64

// CheckName accepts a cache name of 1 to 64 letters, digits, '_', '.' and
// '-', starting with a letter or digit and without "..": a name that is
// one safe directory name under the store, never a path.
func CheckName(name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("cache name %q: want 1 to %d characters", short(name), maxName)
	}
	for i, c := range name {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || i > 0 && (c == '_' || c == '.' || c == '-')
		if !ok {
			return fmt.Errorf("cache name %q: want letters, digits, '_', '.' and '-', starting with a letter or digit", short(name))
		}
	}
	if strings.Contains(name, "..") {
		return fmt.Errorf("cache name %q: \"..\" is not allowed", name)
	}
	return nil
}

// short keeps at most 80 bytes of a name for a message.
func short(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}
