package gitlab

import (
	"bytes"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/microvm/microvm/internal/cachedisk"
	"github.com/microvm/microvm/internal/vms"
)

// FuzzJobEnv feeds the executor's job environment arbitrary values: the
// job response GitLab Runner writes, the job's CUSTOM_ENV_ variables, the
// runner's --cache-key and the stage name. Whatever they hold, the job's
// VM and warm VM names are valid VM names, its record, offer and cache
// (a cache store's name) are directly inside their directories (the records and
// offers written under a temporary state directory, nothing outside it),
// the stage's script stays in the guest's script directory, every name is
// bounded in length, and the variables a job may forge (project path,
// project id) change neither the job's key nor its cache slot.
func FuzzJobEnv(f *testing.F) {
	f.Add([]byte(`{"id": 12, "token": "abc", "job_info": {"project_id": 3}}`), "abc", "12", "0", "", "step_script", "group-proj")
	f.Add([]byte(`{"id": -1, "token": ""}`), "", "../../x", "99999", "../k", "../../etc/passwd", "../victim")
	f.Add([]byte(`not json`), "t", "1", "-1", "web", "a/b\x00c", "")
	f.Add([]byte(`{"token": "t", "job_info": {"project_id": 9223372036854775807}}`), "t", strings.Repeat("9", 30), "0063", strings.Repeat("k", 40), strings.Repeat("s", 300), "x")
	root := f.TempDir()
	state := filepath.Join(root, "state")
	cacheDir := filepath.Join(root, "cache")
	outside := filepath.Join(root, "outside")
	for _, d := range []string{state, cacheDir, outside} {
		if err := os.Mkdir(d, 0o700); err != nil {
			f.Fatal(err)
		}
	}
	f.Setenv("MICROVM_STATE_DIR", state)
	f.Fuzz(func(t *testing.T, respJSON []byte, token, jobID, slot, cacheKey, stage, slug string) {
		vars := map[string]string{"CI_JOB_TOKEN": token, "CI_JOB_ID": jobID, "CI_CONCURRENT_PROJECT_ID": slot,
			"CI_PROJECT_PATH_SLUG": slug, "CI_PROJECT_ID": slug}
		env := func(n string) string { return vars[n] }
		var resp *JobResponse
		if len(respJSON) > 0 {
			r, err := parseJobResponse(bytes.NewReader(respJSON))
			if err != nil {
				return // refused: prepare, run and cleanup stop there
			}
			resp = &r
		}
		id, err := JobIdentityFrom(resp, env)
		if err != nil {
			return
		}
		if len(id.Hash) != 16 || strings.Trim(id.Hash, "0123456789abcdef") != "" {
			t.Fatalf("hash %q", id.Hash)
		}
		name := id.VMName()
		if err := vms.CheckName(name); err != nil {
			t.Fatalf("job VM name: %v", err)
		}
		rec := jobRecordPath(state, id)
		inDir(t, "record", rec, ciJobsDir(state))

		// The forgeable variables change nothing.
		forged := map[string]string{}
		for k, v := range vars {
			forged[k] = v
		}
		forged["CI_PROJECT_PATH_SLUG"], forged["CI_PROJECT_ID"] = "victim", "1"
		if resp != nil {
			forged["CI_JOB_TOKEN"], forged["CI_JOB_ID"] = "victim-token", "1"
		}
		id2, err := JobIdentityFrom(resp, func(n string) string { return forged[n] })
		if err != nil || id2 != id {
			t.Fatalf("forged variables changed the job: %+v, want %+v (%v)", id2, id, err)
		}
		s, err := cacheSlot(id, cacheKey, 64, env)
		s2, err2 := cacheSlot(id, cacheKey, 64, func(n string) string { return forged[n] })
		if s != s2 || (err == nil) != (err2 == nil) {
			t.Fatalf("forged variables changed the cache slot: %q (%v), want %q (%v)", s2, err2, s, err)
		}
		if err == nil {
			if len(s) > maxCacheKey+1+3 {
				t.Fatalf("slot %q: %d bytes", s, len(s))
			}
			if err := vms.CheckName(WarmVMName(s)); err != nil {
				t.Fatalf("warm VM name: %v", err)
			}
			if err := cachedisk.CheckName(s); err != nil {
				t.Fatalf("slot %q is no cache name: %v", s, err)
			}
			inDir(t, "cache", filepath.Join(cacheDir, s), cacheDir)
			inDir(t, "offer", offerPath(s), ciPoolDir())
		}
		gs := stageScriptPath(stage)
		if path.Dir(gs) != ciScriptDir || path.Clean(gs) != gs || len(path.Base(gs)) > 64+3 {
			t.Fatalf("stage %q: script %q", stage, gs)
		}

		// Write what prepare writes for these names, then look: nothing
		// outside the state and cache directories, and the record and
		// offer where they belong.
		if err := createJobRecord(rec, ciJobRecord{VM: name, Slot: s}); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(rec)
		if err == nil {
			if err := writeJSON(offerPath(s), ciOffer{VM: WarmVMName(s)}); err != nil {
				t.Fatal(err)
			}
			defer os.Remove(offerPath(s))
		}
		if err := filepath.WalkDir(outside, func(p string, d fs.DirEntry, err error) error {
			if err == nil && p != outside {
				t.Errorf("written outside the state directory: %s", p)
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if left, _ := os.ReadDir(root); len(left) != 3 {
			t.Fatalf("the root holds %d entries, want state, cache and outside", len(left))
		}
	})
}

// inDir fails unless p is a file directly in dir with a usable name.
func inDir(t *testing.T, what, p, dir string) {
	t.Helper()
	base := filepath.Base(p)
	if filepath.Dir(p) != dir || filepath.Clean(p) != p || base == "." || base == ".." || len(base) > 255 ||
		strings.ContainsAny(base, "/\x00") {
		t.Fatalf("%s %q: not a file in %s", what, p, dir)
	}
}
