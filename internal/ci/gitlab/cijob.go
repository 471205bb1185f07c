package gitlab

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/microvm/microvm/internal/vms"
)

// What keys a CI job's isolation. GitLab lets a project's .gitlab-ci.yml
// override predefined variables, so every CUSTOM_ENV_* value is the job's
// word: CI_JOB_ID or CI_PROJECT_PATH_SLUG set to another job's or
// project's would otherwise name that job's VM or that project's cache.
// The executor keys instead on what the job cannot choose:
//
//   - the job: a hash of its token. GitLab Runner's job response
//     ($JOB_RESPONSE_FILE, written by the runner from what the GitLab
//     server sent) holds the real one; $CUSTOM_ENV_CI_JOB_TOKEN is the
//     fallback for runners without it. A job that overrides its token
//     can only collide with a job whose token it knows, a secret that
//     dies with that job.
//   - the project: the job response's project id, which the server set;
//     or, where the runner gives no job response, the runner's own
//     --cache-key (one project per runner).
//
// The job's id and concurrency slot are used only where a forged value
// harms nobody else: the id is part of the VM's name for people to read,
// next to the token's hash; the slot picks among the proven project's own
// cache disks, bounded by --slots.

// EnvJobResponse names the file in which GitLab Runner gives the custom
// executor the job as the server sent it (not a CUSTOM_ENV_ variable: the
// job cannot set it).
const EnvJobResponse = "JOB_RESPONSE_FILE"

// jobResponseLimit bounds how much of the job response is read: it holds
// the job's variables and script, and only three fields are wanted.
const jobResponseLimit = 16 << 20

// JobResponse is the part of GitLab Runner's job response the executor
// trusts.
type JobResponse struct {
	ID      int64  `json:"id"`
	Token   string `json:"token"`
	JobInfo struct {
		ProjectID int64 `json:"project_id"`
	} `json:"job_info"`
}

// Identity is what a job is known by on this host.
type Identity struct {
	// Hash is 16 hex digits of the SHA-256 of the job's token: it names
	// the job's record and VM.
	Hash string
	// ID is the job's id for people to read: the server's when the job
	// response gave it, else $CUSTOM_ENV_CI_JOB_ID when it is a number,
	// else "".
	ID string
	// Project is the project's id as the GitLab server gave it; "" when
	// there was no job response.
	Project string
}

// parseJobResponse reads the fields the executor trusts from a job
// response, at most jobResponseLimit bytes of it.
func parseJobResponse(r io.Reader) (JobResponse, error) {
	var resp JobResponse
	lr := &io.LimitedReader{R: r, N: jobResponseLimit + 1}
	b, err := io.ReadAll(lr)
	if err != nil {
		return resp, err
	}
	if len(b) > jobResponseLimit {
		return resp, fmt.Errorf("over %d bytes", jobResponseLimit)
	}
	if err := json.Unmarshal(b, &resp); err != nil {
		return resp, err
	}
	if resp.Token == "" {
		return resp, errors.New("no job token in it")
	}
	if resp.ID < 0 || resp.JobInfo.ProjectID < 0 {
		return resp, errors.New("a negative job or project id")
	}
	return resp, nil
}

// JobIdentityFrom derives a job's identity from the runner's job response
// (nil when the runner gave none) and the job's variables (env looks up
// NAME in CUSTOM_ENV_NAME). A job with no token is refused: nothing else
// tells it apart from another job that names the same id.
func JobIdentityFrom(resp *JobResponse, env func(string) string) (Identity, error) {
	var id Identity
	token := env("CI_JOB_TOKEN")
	if resp != nil {
		token = resp.Token
		if resp.ID > 0 {
			id.ID = strconv.FormatInt(resp.ID, 10)
		}
		if resp.JobInfo.ProjectID > 0 {
			id.Project = strconv.FormatInt(resp.JobInfo.ProjectID, 10)
		}
	} else if j := env("CI_JOB_ID"); isDecimal(j, 19) {
		id.ID = j
	}
	if token == "" {
		return id, fmt.Errorf("no job token ($%s and $%sCI_JOB_TOKEN are unset): the executor keys each job's VM on it; run it from GitLab Runner", EnvJobResponse, envJobPrefix)
	}
	// A prefix of its own, so that the hash is of no use elsewhere.
	sum := sha256.Sum256([]byte("microvm ci gitlab job\x00" + token))
	id.Hash = hex.EncodeToString(sum[:8])
	return id, nil
}

// isDecimal: s is 1 to max ASCII digits.
func isDecimal(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// JobIdentity is this job's identity, from $JOB_RESPONSE_FILE when the
// runner set it and the job's variables.
func JobIdentity() (Identity, error) {
	var resp *JobResponse
	if p := os.Getenv(EnvJobResponse); p != "" {
		f, err := os.Open(p)
		if err != nil {
			return Identity{}, fmt.Errorf("job response: %w", err)
		}
		r, err := parseJobResponse(f)
		f.Close()
		if err != nil {
			return Identity{}, fmt.Errorf("job response %s: %w", p, err)
		}
		resp = &r
	}
	return JobIdentityFrom(resp, func(name string) string { return os.Getenv(envJobPrefix + name) })
}

// VMName is the name of the job's own VM: gitlab-ID-HASH, or gitlab-HASH
// without an id (at most 7+19+1+16 = 43 characters).
func (id Identity) VMName() string {
	if id.ID == "" {
		return "gitlab-" + id.Hash
	}
	return "gitlab-" + id.ID + "-" + id.Hash
}

// ciJobsDir holds the job records, one per job that prepare began.
func ciJobsDir(stateDir string) string { return filepath.Join(stateDir, "ci-jobs") }

// jobRecordPath is where prepare records what it made for the job.
func jobRecordPath(stateDir string, id Identity) string {
	return filepath.Join(ciJobsDir(stateDir), id.Hash+".json")
}

// Cache keys: a --cache-key is a file-name part of at most this many bytes.
const maxCacheKey = 32

// CheckCacheKey: a --cache-key is 1 to 32 letters, digits, '_', '.' or '-',
// starting with a letter or digit (it is part of file and VM names).
func CheckCacheKey(k string) error {
	if len(k) > maxCacheKey || vms.CheckName(k) != nil {
		return fmt.Errorf("--cache-key %q: want 1 to %d letters, digits, '_', '.' or '-', starting with a letter or digit", k, maxCacheKey)
	}
	return nil
}

// MaxSlots bounds --slots, so that a slot number stays short.
const MaxSlots = 1000

// cacheSlot is the job's cache slot: the project's namespace (the runner's
// --cache-key, else the project id the server gave), a '-', and the job's
// concurrency slot ($CUSTOM_ENV_CI_CONCURRENT_PROJECT_ID, below slots).
// Without either namespace the project cannot be proven, and prepare is
// refused rather than guessing from variables the job sets.
func cacheSlot(id Identity, cacheKey string, slots int, env func(string) string) (string, error) {
	ns := cacheKey
	switch {
	case cacheKey != "":
		if err := CheckCacheKey(cacheKey); err != nil {
			return "", err
		}
	case id.Project != "":
		ns = "project-" + id.Project
	default:
		return "", fmt.Errorf("the job's project cannot be proven (GitLab Runner gave no $%s): give prepare --cache-key NAME on a runner that serves one project (docs/ci.md, \"Isolation\")", EnvJobResponse)
	}
	if slots < 1 || slots > MaxSlots {
		return "", fmt.Errorf("--slots %d: want 1 to %d", slots, MaxSlots)
	}
	s := env("CI_CONCURRENT_PROJECT_ID")
	if s == "" {
		s = "0"
	}
	n, err := strconv.Atoi(s)
	if !isDecimal(s, 4) || err != nil || n >= slots {
		return "", fmt.Errorf("$%sCI_CONCURRENT_PROJECT_ID %s: want 0 to %d (raise prepare's --slots for a runner that runs more jobs of a project at once)", envJobPrefix, quoteShort(s), slots-1)
	}
	return ns + "-" + strconv.Itoa(n), nil
}

// quoteShort quotes at most 32 bytes of s: for messages about values a
// job chose, which may be long.
func quoteShort(s string) string {
	if len(s) > 32 {
		return strconv.Quote(s[:32]) + "..."
	}
	return strconv.Quote(s)
}

// stageScriptPath is where run puts a stage's script in the guest: the
// stage name (GitLab Runner's, not the job's) kept to file-name
// characters and 64 bytes.
func stageScriptPath(stage string) string {
	s := sanitizeKey(stage)
	if len(s) > 64 {
		s = s[:64]
	}
	return ciScriptDir + "/" + s + ".sh"
}

// sanitizeKey keeps what a file name may hold.
func sanitizeKey(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.' {
			return r
		}
		return '_'
	}, s)
}
