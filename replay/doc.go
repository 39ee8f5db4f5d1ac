// Package replay implements ReplaySSM for KDA layers: periodic checkpoints
// of the recurrent state plus a ring of compact per-step records (k, u, g),
// so that rolling back a rejected speculation, or recovering the state at
// any recent position, replays only a few steps instead of storing a state
// per token.
//
// Status: not implemented yet; this package only reserves the name.
package replay
