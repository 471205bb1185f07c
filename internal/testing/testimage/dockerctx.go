package testimage

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// The small Docker project that the Docker test and make bench-docker
// build in a VM, from a directory shared with it: a busybox image made
// FROM scratch (COPY, RUN) and tagged bb, then an app built from it in two
// stages (the second COPYs from the first, and hello.txt from the
// context). Its container prints "built-in-stage-one" and
// HelloContext.

// HelloContext is hello.txt's content in the build context.
const HelloContext = "hello-from-the-context\n"

const dockerfileApp = `FROM bb AS build
RUN echo built-in-stage-one > /built
FROM bb
COPY --from=build /built /built
COPY hello.txt /hello.txt
CMD ["sh", "-c", "cat /built /hello.txt"]
`

// WriteDockerContext writes the project into dir: this host's busybox
// (Debian's busybox-static), Dockerfile.base with baseExtra (Dockerfile
// lines, such as ENV) before its WORKDIR /work, Dockerfile.app and
// hello.txt.
func WriteDockerContext(dir, baseExtra string) error {
	busybox, err := exec.LookPath("busybox")
	if err != nil {
		return fmt.Errorf("busybox (Debian's busybox-static) for the image built in the VM: %w", err)
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	base := "FROM scratch\nCOPY busybox /bin/busybox\nRUN [\"/bin/busybox\", \"--install\", \"-s\", \"/bin\"]\n" +
		baseExtra + "WORKDIR /work\n"
	for name, data := range map[string]string{
		"busybox": string(bb), "Dockerfile.base": base, "Dockerfile.app": dockerfileApp, "hello.txt": HelloContext,
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o755); err != nil {
			return err
		}
	}
	return nil
}
