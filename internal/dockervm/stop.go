package dockervm

import (
	"context"
	"fmt"

	"github.com/microvm/microvm/internal/agentvm"
)

// Stop ends the dockerd that Start started in the guest r runs commands
// in and waits until it is gone (at most 30 s), so that its data root can
// be unmounted and kept: Docker's data on a cache disk. A guest where
// none runs is fine. Failing to stop it is an *Error with its log's tail.
func Stop(ctx context.Context, r agentvm.Runner) error {
	st, out, err := sh(ctx, r, stopScript, pidPath)
	if err != nil {
		return fmt.Errorf("docker: stopping dockerd: %w", err)
	}
	if st != 0 {
		return &Error{Reason: fmt.Sprintf("stopping dockerd failed (status %d): %s", st, lastLine(out)), Log: tail(ctx, r)}
	}
	return nil
}
