package main

import (
	"os/exec"
	"strings"
	"testing"
)

// notInLean are the packages (a path, or a path and everything under it)
// the lean binary must not link: microvm-full's commands (images, named
// VMs, the control API's client, CI jobs, the agent's client, exec,
// Docker's start for run --docker) and what they bring (urfave/cli, gRPC, protobuf, the registry client,
// gVisor's netstack, net/http).
var notInLean = []string{
	"github.com/microvm/microvm/images",
	"github.com/microvm/microvm/named",
	"github.com/microvm/microvm/internal/image",
	"github.com/microvm/microvm/internal/namedvm",
	"github.com/microvm/microvm/internal/vmctl",
	"github.com/microvm/microvm/internal/ci",
	"github.com/microvm/microvm/internal/agentvm",
	"github.com/microvm/microvm/internal/execvm",
	"github.com/microvm/microvm/internal/dockervm",
	"github.com/urfave/cli/v2",
	"google.golang.org/grpc",
	"google.golang.org/protobuf",
	"github.com/google/go-containerregistry",
	"gvisor.dev",
	"net/http",
}

// forbidden returns the packages of deps that notInLean names.
func forbidden(deps []string) []string {
	var hit []string
	for _, p := range deps {
		for _, no := range notInLean {
			if p == no || strings.HasPrefix(p, no+"/") {
				hit = append(hit, p)
				break
			}
		}
	}
	return hit
}

// TestDeps: the lean binary (this package, with every package it
// imports, as go list -deps tells) links none of notInLean.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps .: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps . lists %d packages; want the whole graph", len(deps))
	}
	if hit := forbidden(deps); len(hit) > 0 {
		t.Errorf("the lean binary imports %v: what only microvm-full's commands use (cmd/microvm-full)", hit)
	}
}

// TestForbidden: the check catches a forbidden package and what lies
// under a forbidden path, and passes a look-alike outside it.
func TestForbidden(t *testing.T) {
	deps := []string{"os", "github.com/microvm/microvm", "github.com/microvm/microvm/internal/ci/gitlab",
		"gvisor.dev/gvisor/pkg/tcpip", "net/http", "net/httptrace", "github.com/microvm/microvm/internal/imagefoo"}
	got := strings.Join(forbidden(deps), " ")
	if want := "github.com/microvm/microvm/internal/ci/gitlab gvisor.dev/gvisor/pkg/tcpip net/http"; got != want {
		t.Errorf("forbidden = %q, want %q", got, want)
	}
}
