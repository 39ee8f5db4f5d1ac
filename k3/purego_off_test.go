//go:build !purego

package k3

const puregoBuild = false
