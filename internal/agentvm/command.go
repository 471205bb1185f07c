package agentvm

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/microvm/microvm/guest/agentapi"
)

// The statuses a shell gives a command it could not run, which RunCommand
// gives one the guest could not run.
const (
	// StatusNotFound: the guest has no program of the command's name.
	StatusNotFound = 127
	// StatusCannotRun: the program was found but could not run (not
	// executable, not a program, no such working directory).
	StatusCannotRun = 126
)

// Command is a command for RunCommand: the agent's Cmd and what only the
// caller has.
type Command struct {
	// Cmd is the command and its streams; Cmd.Stderr also gets
	// RunCommand's one-line notes (not found, cannot run, killed after
	// its timeout). Its Pty and Resize are OpenTTY's to set.
	Cmd agentapi.Cmd
	// Name starts messages ("exec", "agent exec").
	Name string
	// OpenTTY, when not nil, runs the command on a pseudo-terminal: it
	// opens the host's terminal, which RunCommand restores when the
	// command has ended. Its error is returned as is.
	OpenTTY func() (TTY, error)
	// Interrupted, when not nil, is the caller's error when a signal
	// cancelled ctx, else nil; RunCommand returns it as is.
	Interrupted func(ctx context.Context) error
}

// TTY is a host terminal a command runs on (Command.OpenTTY), in raw mode
// while it runs.
type TTY struct {
	// Size is the terminal's size at the start; Resize carries its new
	// sizes (see agentapi.Cmd).
	Size   *agentapi.PtySize
	Resize <-chan *agentapi.PtySize
	// Term is the host's $TERM, the command's TERM when its environment
	// has none ("": xterm).
	Term string
	// Restore gives the terminal its mode back.
	Restore func()
}

// CommandError is an agent call for a command that failed: the agent or
// its VM did, not the command, which may not have run at all.
type CommandError struct {
	// Name starts the message (Command.Name); Program is the command's
	// argv[0].
	Name, Program string
	// Err is the call's error; errors.Is(err, agentapi.ErrAgentLost)
	// when the connection to the agent broke.
	Err error
}

func (e *CommandError) Error() string {
	if errors.Is(e.Err, agentapi.ErrAgentLost) {
		return fmt.Sprintf("%s: %s: lost the connection to the agent (did the agent or its VM stop?): %s", e.Name, e.Program, Message(e.Err))
	}
	return fmt.Sprintf("%s: %s: %s", e.Name, e.Program, Message(e.Err))
}

func (e *CommandError) Unwrap() error { return e.Err }

// Exec dials the agent at a and runs c through it (RunCommand): microvm
// agent exec. A dial that fails is c.Interrupted's error when a signal
// cancelled ctx meanwhile, else the dial's error after c.Name.
func Exec(ctx context.Context, a Addr, c Command) (int, error) {
	cc, err := a.Dial(ctx)
	if err != nil {
		if c.Interrupted != nil {
			if serr := c.Interrupted(ctx); serr != nil {
				return 0, serr
			}
		}
		return 0, fmt.Errorf("%s: %w", c.Name, err)
	}
	defer cc.Close()
	return RunCommand(ctx, cc, c)
}

// RunCommand runs c through the agent on cc and returns its end as a
// shell tells it: its exit code, 128+N for signal N (a --timeout kill is
// 137, after a note on Cmd.Stderr), StatusNotFound or StatusCannotRun
// after a note when the guest could not run it. err is c.OpenTTY's error,
// c.Interrupted's (checked first once the call returns), or a
// *CommandError; the status is then 0.
func RunCommand(ctx context.Context, cc grpc.ClientConnInterface, c Command) (int, error) {
	ac := c.Cmd
	if c.OpenTTY != nil {
		tty, err := c.OpenTTY()
		if err != nil {
			return 0, err
		}
		defer tty.Restore()
		ac.Pty, ac.Resize = tty.Size, tty.Resize
		ac.Env = withTERM(ac.Env, tty.Term)
	}
	st, err := agentapi.NewClient(cc).Exec(ctx, &ac)
	if c.Interrupted != nil {
		if serr := c.Interrupted(ctx); serr != nil {
			return 0, serr
		}
	}
	return c.end(st, err)
}

// withTERM is env with TERM=term (xterm for "") added unless it has a
// TERM; env's array is left as it was.
func withTERM(env []string, term string) []string {
	if _, ok := LookupEnv(env, "TERM"); ok {
		return env
	}
	if term == "" {
		term = "xterm"
	}
	return append(env[:len(env):len(env)], "TERM="+term)
}

// end is the agent call's result, st or err, as RunCommand returns it,
// with its note on Cmd.Stderr.
func (c Command) end(st *agentapi.ExitStatus, err error) (int, error) {
	stderr := c.Cmd.Stderr
	if stderr == nil {
		stderr = io.Discard
	}
	prog := ""
	if len(c.Cmd.Argv) > 0 {
		prog = c.Cmd.Argv[0]
	}
	if err != nil {
		switch status.Code(err) {
		case codes.NotFound:
			fmt.Fprintf(stderr, "microvm: %s: %s: not found in the guest\n", c.Name, prog)
			return StatusNotFound, nil
		case codes.PermissionDenied, codes.FailedPrecondition:
			fmt.Fprintf(stderr, "microvm: %s: %s: cannot run it: %s\n", c.Name, prog, Message(err))
			return StatusCannotRun, nil
		}
		return 0, &CommandError{Name: c.Name, Program: prog, Err: err}
	}
	if st.TimedOut {
		fmt.Fprintf(stderr, "microvm: %s: %s: killed after --timeout %v\n", c.Name, prog, c.Cmd.Timeout)
	}
	return ShellStatus(st), nil
}
