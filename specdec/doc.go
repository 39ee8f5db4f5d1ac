// Package specdec holds the parts of speculative decoding that do not
// depend on a model: the Drafter interface, the n-gram drafter (prompt
// lookup) and the rejection rule of exact speculative sampling (Accept,
// Residual). Package k3 runs the loop: k3.WithSpeculation feeds a drawn
// token and its drafts in one exact pass, keeps the drafts the target's
// own draws confirm, and rolls the rest back through the ReplaySSM logs.
//
// The drafters that run a model live in package k3, since they need one:
// DSpark's draft module (k3.Model.NewDSpark), the self-speculative early
// exit (NewSelfDraft) and a smaller model (NewDraftModel). So does the
// depth chosen per pass from measured costs (k3.WithAdaptiveSpeculation),
// which uses BestDepth here (docs/ARCHITECTURE.md, "Speculative decoding").
package specdec
