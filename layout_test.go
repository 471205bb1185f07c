package microvm

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
	"testing"
)

// The layout of the design card (docs/architecture.md): product packages
// live under these top-level folders, or are the root package.
var productRoots = []string{"cmd", "kvm", "devices", "virtio", "vsock", "guest", "internal"}

// Feature packages of the embedding API: public packages beside the root
// package, each of one feature (images, named VMs) that only the programs
// wanting it import. They may import the root package and internal/; the
// root package and the lower layers do not import them (and the lean CLI,
// cmd/microvm, links none of them: cmd/microvm/deps_test.go).
var featureRoots = []string{"images", "named"}

// Tooling folders a Go project normally has; their packages may import
// any product package, and no product package imports them.
var toolingRoots = []string{"bench", "examples", "conformance"}

// Folders at the top that hold no Go packages of the module's own.
var otherRoots = []string{"docs", "scripts", "testdata", "build", "bin"}

// rootConcepts is the root package, the embedding API, as concepts: each
// product file with the one concept it holds (the root has no build tags,
// so every program that imports it gets the same API; a concept with a
// build-tagged twin would have two files, one in each build). TestLayout fails on a root product
// file that is not here, on two files of one concept in one build, and on
// an entry whose file is gone: a new file is a new concept of the
// embedding API, named here (and in docs/architecture.md's root row) on
// purpose, not a section pushed into an old file to keep a count down.
// Each virtio device kind is a concept, in a file of its own.
var rootConcepts = map[string]string{
	"doc.go":      "the package's documentation and data flow",
	"config.go":   "Config, its checks and the size syntax",
	"machine.go":  "Machine: New, Run, Pause, Resume, Close",
	"devices.go":  "what the device kinds share: deviceKind, slot order, deviceSet, DeviceMetrics, Flag",
	"vsockdev.go": "the vsock device kind",
	"rng.go":      "the rng device kind",
	"disk.go":     "the disk (virtio-blk) device kind",
	"net.go":      "the network (virtio-net) device kind",
	"share.go":    "the shared directory (virtio-9p) device kind",
	"usernet.go":  "the user-mode network's helper process",
	"vsock.go":    "the in-process vsock API: DialVsock, ListenVsock",
	"agent.go":    "WaitAgent: a guest port's first connection, and why none came",
	"metrics.go":  "Metrics and its Prometheus text",
	"snapshot.go": "Snapshot and Restore",
	"pool.go":     "Pool: snapshot clones kept ready",
	"clonemac.go": "a clone's own MACs: MACChanges, AdoptMACs",
	"rootfs.go":   "UseRootfs: an ext4 file as the root file system",
}

// layoutRules says which top-level folders a package under each may not
// import: lower layers never import higher ones. "." is the root package.
// (internal/ holds packages of several floors and is checked by what
// imports it, not by what it imports; nothing may import cmd/.)
var layoutRules = map[string][]string{
	"kvm":     {".", "cmd", "devices", "virtio", "vsock", "guest", "internal/vmm", "images", "named"},
	"virtio":  {".", "cmd", "devices", "vsock", "guest", "internal/vmm", "images", "named"},
	"devices": {".", "cmd", "vsock", "guest", "internal/vmm", "images", "named"},
	"vsock":   {".", "cmd", "devices", "guest", "internal/vmm", "images", "named"},
	".":       {"cmd", "guest", "images", "named"},
	"guest":   {".", "cmd", "devices", "internal/vmm", "images", "named"},
	"images":  {"cmd", "guest", "named"},
	"named":   {"cmd", "guest", "images"},
}

// goPackage is what the layout rules need of `go list`.
type goPackage struct {
	ImportPath     string
	Dir            string
	Imports        []string
	GoFiles        []string
	IgnoredGoFiles []string // left out by build tags (the lean build's files)
}

// rel is a package's path inside the module ("." for the root).
func rel(module, path string) (string, bool) {
	if path == module {
		return ".", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

// top is a module-relative path's top-level folder ("." for the root).
func top(r string) string {
	t, _, _ := strings.Cut(r, "/")
	return t
}

// under says whether module-relative path r is folder f or below it.
func under(r, f string) bool {
	return r == f || strings.HasPrefix(r, f+"/") || (f == "." && r == ".")
}

// folder names a top-level folder (or deeper path) in messages.
func folder(f string) string {
	if f == "." {
		return "the root package"
	}
	return f + "/"
}

// rootFileViolations checks the root package's product files, whatever
// their build tags, against concepts (file name -> the concept it holds).
func rootFileViolations(p goPackage, concepts map[string]string) []string {
	var bad []string
	have := map[string]bool{}
	for _, f := range append(append([]string{}, p.GoFiles...), p.IgnoredGoFiles...) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		have[f] = true
		if _, ok := concepts[f]; !ok {
			bad = append(bad, fmt.Sprintf("the root package's %s holds no concept of rootConcepts (layout_test.go): add its concept there (one concept a file), or move its code to the file of the concept it belongs to", f))
		}
	}
	// One file a concept in a build: two only as build-tagged twins.
	inBuild := map[string]string{}
	for _, f := range p.GoFiles {
		c, ok := concepts[f]
		if !ok {
			continue
		}
		if g, dup := inBuild[c]; dup {
			bad = append(bad, fmt.Sprintf("the root package's %s and %s both hold %q in one build: one file a concept", g, f, c))
		}
		inBuild[c] = f
	}
	for f, c := range concepts {
		if !have[f] {
			bad = append(bad, fmt.Sprintf("rootConcepts (layout_test.go) names %s (%s), which the root package does not have", f, c))
		}
	}
	return bad
}

// layoutViolations checks pkgs (the module's packages) against the rules,
// the root package's files against concepts (rootConcepts), and returns
// one line per violation.
func layoutViolations(module string, concepts map[string]string, pkgs []goPackage) []string {
	var bad []string
	in := func(s string, list []string) bool {
		for _, x := range list {
			if s == x {
				return true
			}
		}
		return false
	}
	for _, p := range pkgs {
		r, ok := rel(module, p.ImportPath)
		if !ok {
			continue
		}
		t := top(r)
		if r != "." && !in(t, productRoots) && !in(t, featureRoots) && !in(t, toolingRoots) {
			bad = append(bad, fmt.Sprintf("package %s lies outside the card's folders (%s), the API's feature packages (%s) and the tooling folders (%s)",
				r, strings.Join(productRoots, ", "), strings.Join(featureRoots, ", "), strings.Join(toolingRoots, ", ")))
		}
		if r == "." {
			bad = append(bad, rootFileViolations(p, concepts)...)
		}
		for _, imp := range p.Imports {
			ir, ok := rel(module, imp)
			if !ok {
				continue
			}
			if top(ir) == "cmd" {
				bad = append(bad, fmt.Sprintf("%s imports %s: nothing imports cmd/", r, ir))
			}
			if !in(t, toolingRoots) && in(top(ir), toolingRoots) {
				bad = append(bad, fmt.Sprintf("%s imports %s: product code does not import tooling", r, ir))
			}
			for _, no := range layoutRules[t] {
				if no != "cmd" && under(ir, no) {
					bad = append(bad, fmt.Sprintf("%s imports %s: %s may not import %s (a lower layer imports a higher one)", r, ir, folder(t), folder(no)))
				}
			}
		}
	}
	sort.Strings(bad)
	return bad
}

// TestLayout: every package of the module sits where the design card puts
// it and imports only what lies below it (docs/architecture.md), and the
// repository's top level holds the card's folders and the tooling folders
// only.
func TestLayout(t *testing.T) {
	out, err := exec.Command("go", "list", "-json", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p goPackage
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages; want the whole module", len(pkgs))
	}
	for _, v := range layoutViolations("github.com/microvm/microvm", rootConcepts, pkgs) {
		t.Error(v)
	}
	checkArchitectureTable(t, "github.com/microvm/microvm", pkgs)
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	allowed := append(append(append(append([]string{}, productRoots...), featureRoots...), toolingRoots...), otherRoots...)
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		ok := false
		for _, a := range allowed {
			ok = ok || e.Name() == a
		}
		if !ok {
			t.Errorf("top-level folder %s/ is none of the card's (%s), the API's feature packages (%s) or the tooling folders (%s)",
				e.Name(), strings.Join(productRoots, ", "), strings.Join(featureRoots, ", "), strings.Join(append(toolingRoots, otherRoots...), ", "))
		}
	}
}

// checkArchitectureTable: docs/architecture.md's "Every package" table has
// one row per package of the module, and no row for a package that does
// not exist.
func checkArchitectureTable(t *testing.T, module string, pkgs []goPackage) {
	t.Helper()
	doc, err := os.ReadFile("docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(doc), "### Every package")
	if !ok {
		t.Fatal(`docs/architecture.md has no "### Every package" section`)
	}
	table, _, _ = strings.Cut(table, "\n## ")
	rows := map[string]int{}
	for _, l := range strings.Split(table, "\n") {
		if !strings.HasPrefix(l, "| `") {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(l, "| `"), "`")
		if name == "microvm" {
			name = "."
		}
		rows[name]++
	}
	for _, p := range pkgs {
		r, _ := rel(module, p.ImportPath)
		if rows[r] != 1 {
			t.Errorf("docs/architecture.md lists package %s %d times; want one row", r, rows[r])
		}
		delete(rows, r)
	}
	for r := range rows {
		t.Errorf("docs/architecture.md lists %s, which is no package of the module", r)
	}
}

// TestLayoutViolations: the checker catches each kind of violation (so
// TestLayout can fail), and accepts a graph that keeps the rules.
func TestLayoutViolations(t *testing.T) {
	const m = "example.com/vmm"
	concepts := map[string]string{"a.go": "the API", "a_lean.go": "the API"}
	good := []goPackage{
		{ImportPath: m, GoFiles: []string{"a.go"}, IgnoredGoFiles: []string{"a_lean.go", "a_integration_test.go"}, Imports: []string{m + "/vsock", m + "/internal/vmm"}},
		{ImportPath: m + "/cmd/x", Imports: []string{m, m + "/guest/agentapi"}},
		{ImportPath: m + "/internal/vmm", Imports: []string{m + "/devices", m + "/kvm"}},
		{ImportPath: m + "/devices/blk", Imports: []string{m + "/virtio", m + "/kvm/eventfd"}},
		{ImportPath: m + "/bench/y", Imports: []string{m, m + "/vsock"}},
	}
	if v := layoutViolations(m, concepts, good); len(v) != 0 {
		t.Errorf("a good graph: %q", v)
	}
	for _, tc := range []struct {
		name string
		pkg  goPackage
		want string
	}{
		{"outside", goPackage{ImportPath: m + "/loader"}, "outside the card's folders"},
		{"kvm imports a device", goPackage{ImportPath: m + "/kvm", Imports: []string{m + "/devices"}}, "kvm/ may not import devices/"},
		{"virtio imports vsock", goPackage{ImportPath: m + "/virtio", Imports: []string{m + "/vsock"}}, "virtio/ may not import vsock/"},
		{"device imports the root", goPackage{ImportPath: m + "/devices/rng", Imports: []string{m}}, "devices/ may not import the root package"},
		{"device imports vmm", goPackage{ImportPath: m + "/devices/rng", Imports: []string{m + "/internal/vmm"}}, "devices/ may not import internal/vmm/"},
		{"vsock imports a device", goPackage{ImportPath: m + "/vsock", Imports: []string{m + "/devices/blk"}}, "vsock/ may not import devices/"},
		{"root imports guest", goPackage{ImportPath: m, GoFiles: []string{"a.go"}, IgnoredGoFiles: []string{"a_lean.go"}, Imports: []string{m + "/guest/agent"}}, "the root package may not import guest/"},
		{"imports cmd", goPackage{ImportPath: m + "/bench/z", Imports: []string{m + "/cmd/x"}}, "nothing imports cmd/"},
		{"product imports tooling", goPackage{ImportPath: m + "/internal/q", Imports: []string{m + "/bench/y"}}, "product code does not import tooling"},
		{"root file without a concept", goPackage{ImportPath: m, GoFiles: []string{"a.go", "gadget.go"}, IgnoredGoFiles: []string{"a_lean.go"}}, "gadget.go holds no concept of rootConcepts"},
		{"tagged root file without a concept", goPackage{ImportPath: m, GoFiles: []string{"a.go"}, IgnoredGoFiles: []string{"a_lean.go", "b_lean.go"}}, "b_lean.go holds no concept"},
		{"concept in two files", goPackage{ImportPath: m, GoFiles: []string{"a.go", "a_lean.go"}}, "a.go and a_lean.go both hold \"the API\" in one build"},
		{"concept without its file", goPackage{ImportPath: m, GoFiles: []string{"a.go"}}, "names a_lean.go (the API), which the root package does not have"},
	} {
		v := layoutViolations(m, concepts, append(append([]goPackage{}, good...), tc.pkg))
		if len(v) != 1 || !strings.Contains(v[0], tc.want) {
			t.Errorf("%s: %q; want one violation saying %q", tc.name, v, tc.want)
		}
	}
}
