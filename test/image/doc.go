// Package image tests the kvroute container image that hack/image/build.sh
// (make image) builds: it builds the image into temporary buildah storage,
// mounts its root filesystem and runs the binary from it as the image's
// non-root user (kvroute version, kvroute serve --help), and checks the
// image's configuration (user, entrypoint, no shell, read-only files).
//
// It needs buildah and chroot (make deps installs buildah) and root, as the
// project's CI has; without them it fails with a message saying so.
package image
