package namedvm

import (
	"errors"

	"github.com/microvm/microvm/guest/agentapi"
	"github.com/microvm/microvm/internal/image"
)

// ErrNoCommand is ImageProcess's error for an image that names no
// command (no Entrypoint and no Cmd) when the caller gives none either.
var ErrNoCommand = errors.New("the image has no Entrypoint and no Cmd")

// ImageProcess is the process a command in an image runs as, the way
// docker run applies the image's configuration cfg to its command line:
// argv is the Entrypoint followed by args, or by the image's Cmd when args
// is empty; the environment is the image's with HOME added when it has
// none and each of env's variables replacing the one of its name; the
// working directory is workdir, else the image's; the user is the
// image's (nil UID and GID when it names none: the agent's, root). It is
// the rule of exec --image's command and of an image VM's main process
// (BootRequest.Main), and WithDefaults is its part that exec --vm applies
// later. The error is ErrNoCommand when argv would be empty.
func ImageProcess(cfg image.Config, args, env []string, workdir string) (Process, error) {
	var p Process
	if len(args) > 0 {
		p.Argv = append(append([]string(nil), cfg.Entrypoint...), args...)
	} else {
		p.Argv = append(append([]string(nil), cfg.Entrypoint...), cfg.Cmd...)
	}
	if len(p.Argv) == 0 {
		return p, ErrNoCommand
	}
	ac := agentapi.Cmd{Env: env, Dir: workdir}
	WithDefaults(&ac, ImageDefaults(cfg))
	p.Env, p.Workdir, p.UID, p.GID = ac.Env, ac.Dir, ac.UID, ac.GID
	return p, nil
}
