// Package specdec holds the parts of speculative decoding that do not
// depend on a model: the Drafter interface, the n-gram drafter (prompt
// lookup) and the rejection rule of exact speculative sampling (Accept,
// Residual). Package k3 runs the loop: k3.WithSpeculation feeds a drawn
// token and its drafts in one exact pass, keeps the drafts the target's
// own draws confirm, and rolls the rest back through the ReplaySSM logs.
//
// DSpark's drafter, the self-speculative and small-model drafters and the
// confidence-scheduled depth are not built yet (docs/ARCHITECTURE.md).
package specdec
