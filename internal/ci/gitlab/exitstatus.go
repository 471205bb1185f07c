package gitlab

import (
	"errors"
	"os"
	"strconv"

	"github.com/microvm/microvm/internal/dockervm"
)

// The environment variables in which GitLab Runner gives the custom
// executor its exit statuses.
const (
	envBuildFailure  = "BUILD_FAILURE_EXIT_CODE"
	envSystemFailure = "SYSTEM_FAILURE_EXIT_CODE"
)

// ExitStatus maps an executor error err (not nil) to the contract's
// statuses: a build failure (the job's script failed) to
// $BUILD_FAILURE_EXIT_CODE, anything else to $SYSTEM_FAILURE_EXIT_CODE;
// without the variables (not run by GitLab Runner) microvm's own
// statuses stay: a build failure's is its script's, and Docker's failure
// to start (prepare --docker) is dockervm.ExitStatus as for exec. say is
// whether err's message is for stderr (a failed script's own output says
// why). ok is false for an error that has no status here: the caller's
// own handling stays.
func ExitStatus(err error) (status int, say, ok bool) {
	var bf BuildFailure
	isBuild := errors.As(err, &bf)
	code, set := exitCodeEnv(envSystemFailure)
	if isBuild {
		code, set = exitCodeEnv(envBuildFailure)
	}
	if set {
		return code, !isBuild, true
	}
	var de *dockervm.Error
	switch {
	case isBuild:
		return bf.Status, false, true
	case errors.As(err, &de):
		return dockervm.ExitStatus, true, true
	}
	return 0, false, false
}

// exitCodeEnv is the exit status in the environment variable name, when
// it holds one (1 to 255).
func exitCodeEnv(name string) (int, bool) {
	n, err := strconv.Atoi(os.Getenv(name))
	return n, err == nil && n > 0 && n < 256
}
