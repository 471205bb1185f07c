// Package images is the Go API of images: OCI and Docker images kept as
// read-only ext4 root file systems (internal/image, docs/images.md), under
// the state directory's images/ as `microvm image` keeps them, and Use to
// boot one. It is a feature package of the embedding API: a program that
// boots no images does not import it, and so links neither the registry
// client nor the image readers and writers; the root package does not
// import it.
//
// Data flow: Open (the store's directory; "" for the CLI's) ->
// Store.Pull (a registry), Store.Import (an archive or layout) or
// Store.ImportRootfs (a root file system tarball), each with a With form
// whose Options carry a progress callback and the unpack limits ->
// internal/image converts the layers into one ext4 and records the image
// -> Store.Get finds it by name, or Store.Find, as --image does: the
// stored image, else the caller's pull (the CLI's adds its progress line
// and the limits of its environment) -> Use puts its ext4
// first in a microvm.Config (Config.UseRootfs) -> microvm.New boots it
// with the agent as /init, which runs the image's commands as its Config
// says.
package images
