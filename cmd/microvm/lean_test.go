package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fullPkg is microvm-full's package, from this one's directory.
const fullPkg = "../microvm-full"

// buildCLI builds package pkg (this one: ".") into dir/name, with make's
// tag.
func buildCLI(t *testing.T, dir, name, pkg string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-tags", "urfave_cli_no_docs", "-o", out, pkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

// inits lists the packages whose init ran, from GODEBUG=inittrace=1.
func inits(t *testing.T, bin string) []string {
	t.Helper()
	cmd := exec.Command(bin, "version")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s version: %v\n%s", bin, err, &stderr)
	}
	var pkgs []string
	for _, l := range strings.Split(stderr.String(), "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[0] == "init" {
			pkgs = append(pkgs, f[1])
		}
	}
	return pkgs
}

// offRunPath are packages the lean binary must not initialise: what only
// the handed-over commands use.
var offRunPath = []string{"google.golang.org/grpc", "google.golang.org/protobuf", "github.com/russross/blackfriday",
	"github.com/cpuguy83/go-md2man", "net/http", "crypto/tls", "compress/gzip", "debug/elf"}

// TestLeanBuild: the lean binary (bin/microvm) initialises none of the
// packages only the handed-over commands use, where microvm-full does
// (so the check can fail); it hands `exec ...` to microvm-full beside it
// with the same arguments; and without microvm-full it says so in one
// line and exits 1.
func TestLeanBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the CLI twice")
	}
	dir := t.TempDir()
	lean := buildCLI(t, dir, "microvm", ".")
	full := buildCLI(t, t.TempDir(), "microvm-full", fullPkg)
	off := func(pkgs []string) []string {
		var hit []string
		for _, p := range pkgs {
			for _, o := range offRunPath {
				if p == o || strings.HasPrefix(p, o+"/") {
					hit = append(hit, p)
				}
			}
		}
		return hit
	}
	if hit := off(inits(t, lean)); len(hit) > 0 {
		t.Errorf("the lean binary initialises %v", hit)
	}
	if hit := off(inits(t, full)); len(hit) == 0 {
		t.Errorf("microvm-full initialises none of %v: the check above proves nothing", offRunPath)
	}

	// Without microvm-full beside it or on PATH.
	cmd := exec.Command(lean, "exec", "--", "true")
	cmd.Env = append(os.Environ(), "PATH=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 ||
		!strings.HasPrefix(stderr.String(), "microvm: exec: microvm-full not found beside "+dir) || strings.Count(stderr.String(), "\n") != 1 {
		t.Errorf("without microvm-full: %v, stderr %q; want status 1 and one line naming it", err, stderr.String())
	}

	// With a stand-in beside it that prints its arguments.
	stand := "#!/bin/sh\necho \"full: $*\"\nexit 7\n"
	if err := os.WriteFile(filepath.Join(dir, "microvm-full"), []byte(stand), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"exec", "--env", "A=b c", "--", "sh", "-c", "exit 3"},
		{"agent", "cp", "--help"},
		{"vhost-user-vsock", "--socket", "x"},
		{"mkfs", "-o", "i.img"},
		{"run", "--name", "ci1", "--detach", "--kernel", "k"}, // named VMs run in microvm-full
		{"run", "--kernel", "k", "--cpuprofile", "p"},         // runtime/pprof is in microvm-full only
		{"run", "--kernel", "k", "--docker"},                  // Docker's start, and its refusal without the agent
		{"run", "--name", "d1", "--image", "ci", "--docker", "--docker-disk", "20G", "--", "sh"},
		{"ls", "--json"},
		{"run", "--help"}, // help and refused flags: urfave/cli's words
		{"run", "--kernel", "k", "--bogus"},
		{"--help"},
		{},
	} {
		out, err := exec.Command(lean, args...).Output()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 7 || string(out) != "full: "+strings.Join(args, " ")+"\n" {
			t.Errorf("%v: %v, stdout %q; want the stand-in's status 7 and its arguments", args, err, out)
		}
	}
	// run and version are the lean binary's own.
	if out, err := exec.Command(lean, "run").CombinedOutput(); err == nil || !strings.Contains(string(out), "--kernel is required") {
		t.Errorf("run without --kernel: %v, %q; want the lean binary's own usage error", err, out)
	}
	for _, args := range [][]string{{"version"}, {"--version"}} {
		if out, err := exec.Command(lean, args...).CombinedOutput(); err != nil || !strings.HasPrefix(string(out), "microvm ") {
			t.Errorf("%v: %v, %q; want the lean binary's own answer", args, err, out)
		}
	}
	// A flag the lean parser refuses, with no microvm-full: its own usage
	// error, status 2.
	os.Remove(filepath.Join(dir, "microvm-full"))
	cmd = exec.Command(lean, "run", "--kernel", "k", "--bogus")
	cmd.Env = append(os.Environ(), "PATH=/nonexistent")
	if out, err := cmd.CombinedOutput(); exitCode(err) != 2 || string(out) != "microvm: run: flag provided but not defined: -bogus\n" {
		t.Errorf("run --bogus without microvm-full: %v, %q; want status 2 and the flag's error", err, out)
	}
}

// exitCode is a finished command's exit status (-1 when it did not exit).
func exitCode(err error) int {
	if err == nil {
		return 0
	}
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	return -1
}

// TestLeanDeps: the lean binary links neither urfave/cli nor what it
// brings (a regexp compiled at start-up, text/template for help), which
// microvm-full links; docs/benchmarks.md ("Start-up") has what that saves.
func TestLeanDeps(t *testing.T) {
	deps := func(pkg string) map[string]bool {
		out, err := exec.Command("go", "list", "-deps", "-tags", "urfave_cli_no_docs", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		m := map[string]bool{}
		for _, p := range strings.Fields(string(out)) {
			m[p] = true
		}
		return m
	}
	lean, full := deps("."), deps(fullPkg)
	for _, p := range []string{"github.com/urfave/cli/v2", "text/template", "regexp"} {
		if lean[p] {
			t.Errorf("the lean binary imports %s", p)
		}
		if !full[p] {
			t.Errorf("microvm-full does not import %s: the check above proves nothing", p)
		}
	}
}
