package main

import "testing"

// TestArtefactBinds: each cached artefact is bound from the same path under
// the host root's cached view onto the repository's path in the new root,
// and none is the repository itself or outside it.
func TestArtefactBinds(t *testing.T) {
	got := artefactBinds("/work/clone")
	if len(got) != len(cachedArtefacts) {
		t.Fatalf("%d binds for %d artefacts", len(got), len(cachedArtefacts))
	}
	for i, b := range got {
		p := cachedArtefacts[i]
		if p == "" || p == "." || p[0] == '/' {
			t.Errorf("artefact %q: want a path inside the repository", p)
		}
		if b.source != "/mnt/lower/work/clone/"+p || b.target != newRoot+"/work/clone/"+p {
			t.Errorf("bind %+v for %q", b, p)
		}
	}
}
