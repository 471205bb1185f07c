package gitlab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/microvm/microvm/internal/atomicfile"
	"github.com/microvm/microvm/internal/namedvm"
	"github.com/microvm/microvm/internal/vms"
)

// The CI executor's warm pool (docs/ci.md, "Warm pool"): with prepare
// --warm-pool N, a job's cleanup boots the next VM for the job's cache
// slot (project and concurrency slot) in the background, from the same
// image and size, with a clone of the slot's cache checked out after the
// job's commit (cicache.go), and offers it; the slot's next prepare
// claims the offer, VM and clone, and pays a cache mount instead of a
// boot.
//
// Files, under $MICROVM_STATE_DIR:
//
//	ci-jobs/HASH.json  what prepare recorded for run and cleanup (ciJobRecord),
//	                   HASH from the job's token (cijob.go)
//	ci-pool/offer-SLOT.json    a warm VM on offer (ciOffer), written before it boots
//	ci-pool/offer-SLOT.json.claimed-HASH   the same, renamed by the prepare that takes it
//
// SLOT is the proven project's (or the runner's --cache-key) and the
// concurrency slot (cacheSlot): a job cannot name another project's slot.
// The rename is the claim: of two processes, one wins. The warm VM's
// cache disk is a clone of its own, so it shares no writable disk with a
// job; a prepare that finds an offer it cannot use (another image or
// size, a VM that died) removes that VM and then its clone.

// ciJobRecord is what prepare tells run and cleanup about a job. Only
// prepare writes it, so the VM it names is one that prepare made or
// claimed: cleanup removes no other.
type ciJobRecord struct {
	VM   string        `json:"vm"`   // the VM the job runs in
	Slot string        `json:"slot"` // its cache slot
	Args []string      `json:"args"` // run's arguments for a VM like it, --name aside
	Pool int           `json:"pool"` // --warm-pool
	TTL  time.Duration `json:"ttl"`  // --warm-ttl
	// Shell runs the job's scripts when the image has not the preferred
	// one (jobShell); "" for that one.
	Shell string `json:"shell,omitempty"`
	// Cache is the job's clone of the slot's cache (cicache.go); nil until
	// prepare checked one out. CacheSize is a fresh cache's size, for the
	// warm VM that cleanup boots.
	Cache     *jobCache `json:"cache,omitempty"`
	CacheSize uint64    `json:"cache_size,omitempty"`
	// CacheLimit is prepare's --cache-limit: the bound (allocated bytes)
	// that cleanup's commits keep the cache store under; 0: none.
	CacheLimit int64 `json:"cache_limit,omitempty"`
	// DockerDisk is Docker's data disk (cidocker.go), made by prepare
	// --docker at dockerDiskPath; "" without --docker.
	DockerDisk string `json:"docker_disk,omitempty"`
	// DockerCache is the job's clone of the slot's Docker cache, its data
	// disk instead of DockerDisk (prepare --docker --docker-cache); nil
	// until prepare checked one out.
	DockerCache *jobCache `json:"docker_cache,omitempty"`
	// Passed and Failed are what run saw of the job (stageOutcome):
	// cleanup commits the cache when it passed and nothing failed.
	Passed bool `json:"passed,omitempty"`
	Failed bool `json:"failed,omitempty"`
}

// shell is the shell that runs the job's scripts: only one of jobShells,
// whatever the record file says, so an edited record cannot pick the program.
func (r ciJobRecord) shell() string {
	if slices.Contains(jobShells[:], r.Shell) {
		return r.Shell
	}
	return jobShells[0]
}

// ciOffer is a warm VM on offer.
type ciOffer struct {
	VM      string    `json:"vm"`
	Args    []string  `json:"args"`
	Created time.Time `json:"created"`
	// Cache is the warm VM's clone of the slot's cache, its disk: the job
	// that claims the VM takes it over.
	Cache *jobCache `json:"cache,omitempty"`
}

func ciPoolDir() string { return filepath.Join(vms.StateDir(), "ci-pool") }

func offerPath(slot string) string { return filepath.Join(ciPoolDir(), "offer-"+slot+".json") }

// WarmVMName is the name of a slot's warm VM (at most 5+32+1+3 = 41
// characters: cacheSlot bounds the slot).
func WarmVMName(slot string) string { return "warm-" + slot }

// jobVM reads the record this job's prepare wrote; nil (and no error)
// when there is none.
func jobVM() (*ciJobRecord, string, error) {
	id, err := JobIdentity()
	if err != nil {
		return nil, "", err
	}
	path := jobRecordPath(vms.StateDir(), id)
	var rec ciJobRecord
	if err := readJSON(path, &rec); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, path, nil
		}
		return nil, "", fmt.Errorf("job record: %w", err)
	}
	if err := vms.CheckName(rec.VM); err != nil {
		return nil, "", fmt.Errorf("job record %s: %w", path, err)
	}
	return &rec, path, nil
}

// createJobRecord writes rec to path whole, and only when no record is
// there: a second prepare for the same job token is refused rather than
// taking over the first one's VM.
func createJobRecord(path string, rec ciJobRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := atomicfile.Create(path, b, 0o600); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("job record %s exists: a prepare already ran for this job token", path)
		}
		return err
	}
	return nil
}

// claimWarm takes the slot's offered VM when it was made with args and
// answers within wait; it returns the VM's name and its cache clone, or
// "" when there was none to take (an unusable one is removed with its
// clone).
func claimWarm(job, slot string, args []string, wait time.Duration, stderr io.Writer) (string, *jobCache) {
	offer := offerPath(slot)
	claimed := offer + ".claimed-" + job
	if err := os.Rename(offer, claimed); err != nil {
		return "", nil // none on offer
	}
	defer os.Remove(claimed)
	var o ciOffer
	if err := readJSON(claimed, &o); err != nil || vms.CheckName(o.VM) != nil {
		fmt.Fprintf(stderr, "microvm: warm pool: unreadable offer %s (%v): booting a VM\n", offer, err)
		return "", nil
	}
	// Wait even for a VM that will not do: removed while it still boots,
	// it would come up afterwards, holding its cache clone.
	if err := waitWarmVM(o.VM, wait); err != nil {
		fmt.Fprintf(stderr, "microvm: warm pool: VM %s: %v: removing it, booting a VM\n", o.VM, err)
		discardOffered(o)
		return "", nil
	}
	if !slices.Equal(o.Args, args) || o.Cache == nil {
		fmt.Fprintf(stderr, "microvm: warm pool: VM %s was made for another image or size: removing it, booting a VM\n", o.VM)
		discardOffered(o)
		return "", nil
	}
	fmt.Fprintf(stderr, "microvm: warm pool: took VM %s (offered %v ago)\n", o.VM, time.Since(o.Created).Round(time.Millisecond))
	return o.VM, o.Cache
}

// discardOffered removes an offered VM that no job will take, and then
// its cache clone.
func discardOffered(o ciOffer) {
	if discardVM(o.VM) == nil {
		_ = o.Cache.discard()
	}
}

// waitWarmVM waits until the named VM's agent answers: a warm VM may still
// be booting when the next job comes.
func waitWarmVM(name string, wait time.Duration) error {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	deadline := time.Now().Add(wait)
	for {
		e, err := store.Get(name)
		switch {
		case err == nil && e.Alive:
			ctx, cancel := context.WithTimeout(context.Background(), time.Until(deadline))
			cc, err := namedvm.AgentAddr(e, time.Until(deadline)).Dial(ctx)
			cancel()
			if err == nil {
				cc.Close()
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("its agent did not answer within %v", wait)
			}
		case err == nil && e.State == vms.StateExited:
			return fmt.Errorf("it ended (%s)", e.ExitReason)
		case err != nil && !errors.Is(err, vms.ErrNotFound):
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not running after %v", wait)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// refillPool runs in cleanup: it removes offered VMs older than the TTL,
// then, when fewer than rec.Pool are on offer and the slot has none,
// offers a new VM for it and starts it in the background (its boot is
// the next job's gain; cleanup does not wait for it).
func refillPool(rec *ciJobRecord, stderr io.Writer) {
	dir := ciPoolDir()
	offers, _ := filepath.Glob(filepath.Join(dir, "offer-*.json"))
	live := 0
	for _, p := range offers {
		var o ciOffer
		if err := readJSON(p, &o); err != nil {
			continue
		}
		if rec.TTL > 0 && time.Since(o.Created) > rec.TTL {
			if takeOffer(p) {
				fmt.Fprintf(stderr, "microvm: warm pool: VM %s unused for %v: removing it\n", o.VM, rec.TTL)
				discardOffered(o)
			}
			continue
		}
		live++
	}
	offer := offerPath(rec.Slot)
	if _, err := os.Stat(offer); err == nil || live >= rec.Pool {
		return
	}
	name := WarmVMName(rec.Slot)
	_ = discardVM(name) // a leftover of the same name, if any
	if rec.Cache == nil {
		return // a record from before prepare checked caches out
	}
	cache, disk, err := checkoutCache(rec.Cache.Dir, rec.Slot, rec.CacheSize, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "microvm: warm pool: cache %s: %v\n", rec.Slot, err)
		return
	}
	if err := writeJSON(offer, ciOffer{VM: name, Args: rec.Args, Created: time.Now(), Cache: cache}); err != nil {
		fmt.Fprintf(stderr, "microvm: warm pool: %v\n", err)
		_ = cache.discard()
		return
	}
	if err := startBackground(filepath.Join(dir, name+".log"), append([]string{"run", "--name", name}, withDisk(rec.Args, disk)...)); err != nil {
		fmt.Fprintf(stderr, "microvm: warm pool: starting VM %s: %v\n", name, err)
		os.Remove(offer)
		_ = cache.discard()
		return
	}
	fmt.Fprintf(stderr, "microvm: warm pool: booting VM %s for the slot's next job\n", name)
}

// takeOffer claims the offer at path for removal; false when another
// process took it first.
func takeOffer(path string) bool {
	claimed := path + ".claimed-sweep"
	if os.Rename(path, claimed) != nil {
		return false
	}
	os.Remove(claimed)
	return true
}

// Drain removes every offered VM: `microvm ci gitlab drain`, when the
// runner stops. A VM still booting is waited for (up to wait) first.
func Drain(stdout io.Writer, wait time.Duration) error {
	offers, err := filepath.Glob(filepath.Join(ciPoolDir(), "offer-*.json"))
	if err != nil {
		return err
	}
	for _, p := range offers {
		var o ciOffer
		if readJSON(p, &o) != nil || !takeOffer(p) {
			continue
		}
		_ = waitWarmVM(o.VM, wait)
		if err := discardVM(o.VM); err != nil {
			return fmt.Errorf("ci gitlab drain: %w", err)
		}
		if err := o.Cache.discard(); err != nil {
			return fmt.Errorf("ci gitlab drain: VM %s's cache: %w", o.VM, err)
		}
		fmt.Fprintf(stdout, "removed warm VM %s\n", o.VM)
	}
	return nil
}

// discardVM stops the named VM at once and removes it; a VM that is not
// there is fine.
func discardVM(name string) error {
	store, err := vms.Open(vms.StateDir())
	if err != nil {
		return err
	}
	e, err := store.Get(name)
	if err != nil {
		return nil // never started, or removed already
	}
	if e.Alive {
		if err := namedvm.Stop(name, true, 0); err != nil {
			return err
		}
	}
	return store.Remove(name)
}

// startBackground starts this program with args in a session of its own,
// its output in logPath, and does not wait for it.
func startBackground(logPath string, args []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.Command(exe, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// writeJSON writes v to path whole or not at all (atomicfile), making
// its directory first.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}
