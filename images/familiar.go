package images

import "strings"

// Familiar shortens stored names as docker shows them: Docker Hub's
// index.docker.io/library/debian:12 is debian:12, and
// index.docker.io/grafana/grafana:11 is grafana/grafana:11. Other
// registries' names stay whole.
func Familiar(refs []string) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		r = strings.TrimPrefix(r, "index.docker.io/")
		out[i] = strings.TrimPrefix(r, "library/")
	}
	return out
}
