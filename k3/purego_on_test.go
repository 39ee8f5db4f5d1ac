//go:build purego

package k3

// puregoBuild: the plain-Go kernels run (slower); statistical tests that
// check the loop, not the kernels, run fewer rounds.
const puregoBuild = true
