package microvm

import (
	"fmt"
)

// maxSunPath is the longest path a Unix socket address holds (sun_path,
// less its terminating NUL).
const maxSunPath = 107

// CheckMetricsSocket checks a Config.MetricsSocket path as New does before
// it creates anything: empty is off; a path longer than a Unix socket
// address holds is an ErrConfig. (Whether its directory exists, or a live
// socket is there, New finds out when it creates the socket.)
func CheckMetricsSocket(path string) error {
	if path == "" {
		return nil
	}
	if len(path) > maxSunPath {
		return fmt.Errorf("%w: metrics socket path %q is %d bytes; a Unix socket path holds at most %d",
			ErrConfig, path, len(path), maxSunPath)
	}
	return nil
}
