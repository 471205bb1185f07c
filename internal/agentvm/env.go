package agentvm

import "strings"

// BaseEnv is a command's environment where no image gives one, in a new
// slice: the usual directories on PATH and root's HOME. A caller's own
// variables follow it.
func BaseEnv() []string {
	return []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root"}
}

// MergeEnv is base with each KEY=VALUE of over replacing base's KEY (or
// appended): one entry per name, so every reader of the environment
// (getenv takes the first, some shells the last) sees the same value.
func MergeEnv(base, over []string) []string {
	out := append([]string(nil), base...)
	for _, e := range over {
		k, _, _ := strings.Cut(e, "=")
		replaced := false
		for i, b := range out {
			if bk, _, _ := strings.Cut(b, "="); bk == k {
				out[i], replaced = e, true
			}
		}
		if !replaced {
			out = append(out, e)
		}
	}
	return out
}

// LookupEnv is key's value in env (KEY=VALUE entries), as os.LookupEnv
// for the process's own.
func LookupEnv(env []string, key string) (string, bool) {
	for _, e := range env {
		if k, v, _ := strings.Cut(e, "="); k == key {
			return v, true
		}
	}
	return "", false
}
