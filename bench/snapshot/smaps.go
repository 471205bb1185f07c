package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// memUse is a process's memory from /proc/PID/smaps_rollup, in bytes.
// PSS (proportional set size) divides each page among the processes that
// map it, so the PSS of several processes adds up to what they take
// together: pages of the VMM's binary and of the snapshot's memory file
// (mapped MAP_PRIVATE from the page cache) that clones share count once.
type memUse struct {
	RSS      int64 `json:"rss_bytes"`
	PSS      int64 `json:"pss_bytes"`
	PSSAnon  int64 `json:"pss_anon_bytes"`
	PSSFile  int64 `json:"pss_file_bytes"`
	PSSShmem int64 `json:"pss_shmem_bytes"`
	// PrivateDirty is memory only this process has written: the guest
	// pages it copied on write, the VMM's heap and stacks.
	PrivateDirty int64 `json:"private_dirty_bytes"`
}

// readMemUse reads /proc/pid/smaps_rollup.
func readMemUse(pid int) (memUse, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return memUse{}, err
	}
	defer f.Close()
	u, err := parseSmapsRollup(f)
	if err != nil {
		return u, fmt.Errorf("/proc/%d/smaps_rollup: %w", pid, err)
	}
	return u, nil
}

// parseSmapsRollup reads the "Key:   N kB" lines of smaps_rollup; a file
// without Rss and Pss lines is an error.
func parseSmapsRollup(r io.Reader) (memUse, error) {
	var u memUse
	fields := map[string]*int64{
		"Rss": &u.RSS, "Pss": &u.PSS, "Pss_Anon": &u.PSSAnon, "Pss_File": &u.PSSFile,
		"Pss_Shmem": &u.PSSShmem, "Private_Dirty": &u.PrivateDirty,
	}
	seen := 0
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, rest, ok := strings.Cut(sc.Text(), ":")
		dst := fields[key]
		if !ok || dst == nil {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return u, fmt.Errorf("%s: want \"N kB\", got %q", key, strings.TrimSpace(rest))
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return u, fmt.Errorf("%s: %w", key, err)
		}
		*dst = kb << 10
		if key == "Rss" || key == "Pss" {
			seen++
		}
	}
	if err := sc.Err(); err != nil {
		return u, err
	}
	if seen != 2 {
		return u, fmt.Errorf("no Rss and Pss lines")
	}
	return u, nil
}

// add adds o to u.
func (u *memUse) add(o memUse) {
	u.RSS += o.RSS
	u.PSS += o.PSS
	u.PSSAnon += o.PSSAnon
	u.PSSFile += o.PSSFile
	u.PSSShmem += o.PSSShmem
	u.PrivateDirty += o.PrivateDirty
}
