package dockervm

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/agentvm"
)

// Runner runs a command in the guest, as the guest agent's Exec does.
type Runner interface {
	// Run runs argv with no input and returns its exit status as a shell
	// tells it (128+N for signal N) and its standard output and error
	// together, of which the runner may keep only the end. err is for the
	// agent or the VM failing, never for the command's own status; a
	// program the guest does not have is ErrNotInImage (errors.Is).
	Run(ctx context.Context, argv []string) (status int, output string, err error)
}

// ErrNotInImage: the guest has no program of the command's name.
var ErrNotInImage = errors.New("not found in the image")

// maxOutput bounds what AgentRunner keeps of a command's output: the
// steps print a line or two, and the log tail logLines lines.
const maxOutput = 64 << 10

// AgentRunner is the Runner of a VM whose agent Client answers; Env is the
// commands' environment (the image's, as for the user's command).
type AgentRunner struct {
	Client *agentapi.Client
	Env    []string
}

// Run runs argv through the agent.
func (a AgentRunner) Run(ctx context.Context, argv []string) (int, string, error) {
	out := &agentvm.TailBuffer{Max: maxOutput}
	st, err := a.Client.Exec(ctx, &agentapi.Cmd{Argv: argv, Env: a.Env, Stdout: out, Stderr: out})
	if status.Code(err) == codes.NotFound {
		return 0, "", fmt.Errorf("%s: %w", argv[0], ErrNotInImage)
	}
	if err != nil {
		return 0, "", fmt.Errorf("%s: %w", argv[0], err)
	}
	return agentvm.ShellStatus(st), out.String(), nil
}
