package main

import (
	"context"
	"fmt"
	"io"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/urfave/cli/v2"

	"github.com/microvm/microvm/internal/agentvm"
	"github.com/microvm/microvm/internal/clibase"
)

// agentCommand groups the clients of the agent of a running VM: one
// started with `microvm run --vsock-uds PATH` from a `microvm initramfs`
// image, or any guest whose agent listens on the vsock port.
func agentCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "agent",
		Usage:        agentUsage,
		UsageText:    "microvm agent exec|cp --uds PATH [flags] ...",
		OnUsageError: onUsageError,
		Subcommands: []*cli.Command{
			agentExecCommand(stdin, stdout, stderr),
			agentCpCommand(stdin, stdout, stderr),
		},
		Action: func(c *cli.Context) error {
			if c.NArg() == 0 {
				return clibase.Usagef("agent: want a subcommand, exec or cp (see microvm agent --help)")
			}
			return clibase.Usagef("agent: unknown subcommand %q (want exec or cp)", c.Args().First())
		},
	}
}

// agentDialFlags say where the agent is; readAgentAddr reads them.
func agentDialFlags() []cli.Flag {
	return append([]cli.Flag{
		&cli.StringFlag{Name: "uds", Usage: "the VM's vsock Unix socket (--vsock-uds of microvm run) (required)"},
		&cli.Uint64Flag{Name: "port", Value: agentPort, Usage: "the agent's guest vsock port"},
		&cli.DurationFlag{Name: "connect-timeout", Value: 5 * time.Second, Usage: "how long to wait for the agent to accept"},
	}, cliFlags(clibase.LogFlags())...)
}

func readAgentAddr(c *cli.Context, name string) (agentvm.Addr, error) {
	a := agentvm.Addr{UDS: c.String("uds"), Port: uint32(c.Uint64("port")), Timeout: c.Duration("connect-timeout")}
	if a.UDS == "" {
		return a, clibase.Usagef("%s: --uds PATH is required", name)
	}
	if c.Uint64("port") > 0xfffffffe {
		return a, clibase.Usagef("%s: --port %d: want 0..4294967294", name, c.Uint64("port"))
	}
	if a.Timeout <= 0 {
		return a, clibase.Usagef("%s: --connect-timeout %v: want a positive duration", name, a.Timeout)
	}
	return a, nil
}

func agentExecCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:         "exec",
		Usage:        "run a command through the agent of a running VM",
		UsageText:    "microvm agent exec --uds PATH [--port N] [--env K=V]... [--workdir DIR] [--timeout D] -- CMD [ARG...]",
		OnUsageError: onUsageError,
		Flags:        concatFlags(agentDialFlags(), guestCmdFlags()),
		Action: func(c *cli.Context) error {
			const name = "agent exec"
			a, err := readAgentAddr(c, name)
			if err != nil {
				return err
			}
			cmd, err := readGuestCmd(c, name, "microvm agent exec --uds PATH [flags] -- CMD [ARG...]")
			if err != nil {
				return err
			}
			log, err := clibase.SetupLog(c, stderr)
			if err != nil {
				return err
			}
			if err := checkTTY(cmd, stdin); err != nil {
				return err
			}
			cmd.stdin, cmd.stdout, cmd.stderr = stdin, stdout, stderr
			ctx, stop := clibase.Interruptible(context.Background())
			defer stop()
			return commandEnd(agentvm.Exec(ctx, a, cmd.agentCommand(name, log)))
		},
	}
}

func agentCpCommand(stdin io.Reader, stdout, stderr io.Writer) *cli.Command {
	return &cli.Command{
		Name:  "cp",
		Usage: "copy a file into or out of a running VM through its agent",
		Description: "Exactly one of SRC and DST is guest:/PATH. Copied into the guest, a file keeps its mode bits " +
			"(0644 from stdin) and gets missing parent directories; copied out, it is written to a temporary file " +
			"beside DST and renamed, without its setuid, setgid and sticky bits unless --keep-setuid. A DST ending " +
			"in / or naming a directory gets SRC's base name. - as the host side is stdin or stdout.",
		UsageText:    "microvm agent cp --uds PATH [--port N] SRC DST",
		OnUsageError: onUsageError,
		Flags:        append(agentDialFlags(), keepSetuidFlag),
		Action: func(c *cli.Context) error {
			a, err := readAgentAddr(c, "agent cp")
			if err != nil {
				return err
			}
			if c.NArg() != 2 {
				return clibase.Usagef("agent cp: want SRC and DST, one of them guest:/PATH (got %d arguments)", c.NArg())
			}
			cp, err := parseCopy(c.Args().Get(0), c.Args().Get(1))
			if err != nil {
				return err
			}
			cp.KeepSpecial = c.Bool(keepSetuidFlag.Name)
			log, err := clibase.SetupLog(c, stderr)
			if err != nil {
				return err
			}
			return copyWithAgent("agent cp", cp, a, stdin, stdout, log)
		},
	}
}

// keepSetuidFlag is cp's opt-in to the guest's setuid, setgid and sticky
// bits on the host: off, a guest cannot plant a set-id program owned by
// whoever copies it out (root, often).
var keepSetuidFlag = &cli.BoolFlag{Name: "keep-setuid",
	Usage: "keep the setuid, setgid and sticky bits (07000) of what is copied out of the guest (cleared by default)"}

// guestPrefix marks the guest side of agent cp.
const guestPrefix = agentvm.GuestPrefix

// parseCopy checks agent cp's SRC and DST.
func parseCopy(src, dst string) (agentvm.Copy, error) {
	gsrc, srcIsGuest := strings.CutPrefix(src, guestPrefix)
	gdst, dstIsGuest := strings.CutPrefix(dst, guestPrefix)
	if srcIsGuest == dstIsGuest {
		return agentvm.Copy{}, clibase.Usagef("agent cp: exactly one of SRC %q and DST %q must be %s/PATH", src, dst, guestPrefix)
	}
	cp := agentvm.Copy{ToGuest: dstIsGuest, Guest: gsrc, Host: dst}
	if cp.ToGuest {
		cp.Guest, cp.Host = gdst, src
	}
	if !path.IsAbs(cp.Guest) {
		return cp, clibase.Usagef("agent cp: guest path %q must be absolute", cp.Guest)
	}
	if cp.Host == "" {
		return cp, clibase.Usagef("agent cp: empty host path (- means stdin or stdout)")
	}
	if cp.ToGuest && strings.HasSuffix(cp.Guest, "/") {
		if cp.Host == "-" {
			return cp, clibase.Usagef("agent cp: %s%s: name the guest file when copying from stdin", guestPrefix, cp.Guest)
		}
		cp.Guest += filepath.Base(cp.Host)
	}
	return cp, nil
}

// copyWithAgent carries out cp through the agent at a, and turns its end
// into a status: 1 when a file is the problem (on either side, as cp(1)),
// a failure (125) when the agent or the VM is.
func copyWithAgent(name string, cp agentvm.Copy, a agentvm.Addr, stdin io.Reader, stdout io.Writer, log logrus.FieldLogger) error {
	ctx, stop := clibase.Interruptible(context.Background())
	defer stop()
	err := cp.Run(ctx, a, stdin, stdout)
	if serr := clibase.SignalStatus(ctx, log); serr != nil {
		return serr
	}
	switch {
	case err == nil:
		return nil
	case agentvm.IsFileProblem(err):
		// The guest file is the problem, as for cp(1): status 1.
		return fmt.Errorf("%s: %w", name, err)
	case agentvm.IsHostSide(err):
		return fmt.Errorf("%s: %w", name, err)
	}
	return clibase.Failure{Err: fmt.Errorf("%s: %w", name, err)}
}
