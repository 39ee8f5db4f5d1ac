package k3

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"k3/specdec"
)

// WithSpeculation makes Session.Generate speculate: after each drawn
// token, d proposes up to depth more, the session runs the token and its
// drafts in one exact pass, and the generation draws from that pass's
// logits in order, keeping each draft its own draw confirms and rolling the
// session back past the first that differs. The tokens are exactly those
// of plain decoding (greedy token for token; with sampling, the same
// tokens for the same seed), in fewer passes when drafts are accepted.
// The rollback uses the sessions' replay logs, so the model must be
// loaded WithRollback(n) with n >= depth; depth is at most ExactTokens-1.
// The Batcher speculates too, each sequence at its own depth, the verify
// rows of several sequences in one pass; a sequence's verify rows stay
// within one pass's token budget (WithTokenBudget), so a budget of n rows
// drafts at most n-1 tokens.
func WithSpeculation(d specdec.Drafter, depth int) GenerateOption {
	return func(o *genOptions) {
		switch {
		case d == nil:
			o.fail("speculation without a drafter")
		case depth < 1 || depth > ExactTokens-1:
			o.fail("speculation depth %d, want 1..%d", depth, ExactTokens-1)
		}
		o.drafter, o.depth, o.adaptive = d, depth, false
	}
}

// WithAdaptiveSpeculation is WithSpeculation with the depth chosen before
// every verify pass, from 0 (a plain decode step) to maxDepth: the depth
// that maximises the expected tokens per unit of cost, from the drafts'
// acceptance so far (specdec.Acceptance) and the verify passes' costs
// measured on this machine (Model.SpeculationCosts, at first use). It
// speculates only where that promises at least specdec.MinGain over plain
// decoding. While it decodes plainly it still asks the drafter for one
// token after each and compares it with the next draw, so the estimate
// follows the drafts without a verify pass (free for the n-gram drafter,
// one draft for a model drafter). Where the memory budget leaves no room
// for the measurement's scratch sessions it goes by the costs measured
// before, or decodes plainly with none.
func WithAdaptiveSpeculation(d specdec.Drafter, maxDepth int) GenerateOption {
	return func(o *genOptions) {
		WithSpeculation(d, maxDepth)(o)
		o.adaptive = true
	}
}

// WithRejectionSampling makes a sampling speculation (WithSpeculation or
// WithAdaptiveSpeculation, with a temperature) exact in distribution
// rather than token for token: a drafter that has distributions of its
// own (specdec.Sampler: the model drafters and DSpark) draws each draft
// from its logits under the generation's processing (temperature, top-k,
// top-p, min-p, penalties counting the drafts before it, logit bias), and
// each draft is kept with probability min(1, p/q) against the target's
// distribution p, or replaced by a draw from the normalised max(0, p - q);
// a drafter without (the n-gram drafter) counts as q one-hot on its draft.
// The tokens are distributed as plain sampling's, and a draft is kept
// with probability Σ min(p, q), often more than the p of one fixed draft
// that the default (coupled) mode keeps; but they are not the tokens
// plain sampling draws for the same seed, which the coupled mode
// guarantees. For a seed they are the same alone and in a Batcher at a
// fixed depth whose verify run fits the Batcher's token budget (the
// default budget's does; WithTokenBudget); at an adaptive one the depths,
// chosen from costs measured per batch shape, may differ, and so may the
// draws. Greedy generations ignore the option: their verification is
// already exact token for token.
func WithRejectionSampling() GenerateOption {
	return func(o *genOptions) { o.rejection = true }
}

// SpeculationCosts measures, once per model, what verify passes of 1 to
// n+1 tokens cost on this machine relative to a decode step (n the
// model's WithRollback depth, at most ExactTokens-1: the deepest a
// speculation can go), and
// what a rollback of rejected drafts adds (medians of three rounds on a
// scratch session whose logs hold as many records as a speculating
// session's do on average); WithAdaptiveSpeculation chooses its depths by
// them. It needs the model loaded WithRollback.
func (m *Model) SpeculationCosts(ctx context.Context) (specdec.Costs, error) {
	m.specMu.Lock()
	defer m.specMu.Unlock()
	if m.specCosts.Pass != nil {
		return m.specCosts, nil
	}
	if m.rollback == 0 {
		return specdec.Costs{}, fmt.Errorf("%w: measuring speculation costs needs the model loaded WithRollback", ErrInvalidOption)
	}
	s, err := m.NewSession()
	if err != nil {
		return specdec.Costs{}, err
	}
	defer s.Close()
	v := m.Config.VocabSize
	// A prompt, then as many single steps as the logs hold records on
	// average in a speculating generation (their checkpoint moves every
	// rollback+ExactTokens tokens, keeping rollback), so that a rollback
	// replays what it replays there.
	fed := 32 + m.rollback + ExactTokens/2
	toks := make([]int32, fed+2*ExactTokens)
	for i := range toks {
		toks[i] = int32((i*7 + 3) % v)
	}
	if _, err := s.run(ctx, toks[:32], false); err != nil {
		return specdec.Costs{}, err
	}
	for _, t := range toks[32:fed] {
		if _, err := s.run(ctx, []int32{t}, false); err != nil {
			return specdec.Costs{}, err
		}
	}
	toks = toks[fed:]
	out := make([]float32, ExactTokens*v)
	pos := s.pos
	// Each pass runs on a fork of s (its logs copied) after a pass of as
	// many tokens that the fork's copied state warms up, as the loop's
	// passes follow one another (the first pass on a fork runs colder than
	// any pass of the loop: on a model this small, about twice a step),
	// and rolls back to its first token, as the loop's passes do.
	const rounds = 3
	maxN := min(ExactTokens, m.rollback+1) // the logs reach back rollback tokens
	times := make([][]float64, maxN+1)
	var rollbacks []float64
	for r := 0; r <= rounds; r++ { // round 0 warms up
		for n := 1; n <= maxN; n++ {
			f, err := s.Fork()
			if err != nil {
				return specdec.Costs{}, err
			}
			var t time.Duration
			if err = f.runInto(ctx, toks[:n], out[:n*v]); err == nil {
				start := time.Now()
				err = f.runInto(ctx, toks[n:2*n], out[:n*v])
				t = time.Since(start)
			}
			if err == nil && n > 1 {
				start := time.Now()
				var ok bool
				if ok, err = f.rollback(pos + n + 1); err == nil && !ok {
					err = errors.New("the logs do not reach back a pass")
				}
				if r > 0 {
					rollbacks = append(rollbacks, float64(time.Since(start)))
				}
			}
			f.Close()
			if err != nil {
				return specdec.Costs{}, fmt.Errorf("k3: measuring speculation costs: %w", err)
			}
			if r > 0 {
				times[n] = append(times[n], float64(t))
			}
		}
	}
	step := medianOf(times[1])
	c := specdec.Costs{Pass: make([]float64, maxN+1), Rollback: 0, Step: step / 1e9}
	if len(rollbacks) > 0 {
		c.Rollback = medianOf(rollbacks) / step
	}
	for n := 1; n <= maxN; n++ {
		c.Pass[n] = medianOf(times[n]) / step
	}
	m.specCosts = c
	return c, nil
}

// SpeculationCostsAt is SpeculationCosts for a verify run among batch
// sequences that all speculate, as inside a Batcher: Pass[n] is what a
// pass of n rows for each of them costs against a pass of one row each
// (the decode step at that batch), so that the depth chosen maximises the
// batch's tokens per second. Batches are measured by powers of two (the
// largest not above batch) once per model; at large batches, where a
// pass is bound by arithmetic, every draft row costs about a decode row
// and the depth chosen is 0. The rollback cost is the lone session's.
func (m *Model) SpeculationCostsAt(ctx context.Context, batch int) (specdec.Costs, error) {
	if batch <= 1 {
		return m.SpeculationCosts(ctx)
	}
	b := 1
	for b*2 <= min(batch, 64) {
		b *= 2
	}
	lone, err := m.SpeculationCosts(ctx)
	if err != nil {
		return specdec.Costs{}, err
	}
	m.specMu.Lock()
	defer m.specMu.Unlock()
	if c, ok := m.specBatch[b]; ok {
		return c, nil
	}
	maxN := len(lone.Pass) - 1
	bt, err := m.NewBatch(b * maxN)
	if err != nil {
		return specdec.Costs{}, err
	}
	v := m.Config.VocabSize
	sessions := make([]*Session, b)
	defer func() {
		for _, s := range sessions {
			if s != nil {
				s.Close()
			}
		}
	}()
	cu := make([]int32, b+1)
	ids := make([]int32, 0, b*max(32, maxN))
	for i := range sessions {
		if sessions[i], err = m.NewSession(); err != nil {
			return specdec.Costs{}, err
		}
		ids = ids[:0]
		for j := range 32 {
			ids = append(ids, int32((i*131+j*7+3)%v))
		}
		if _, err := sessions[i].run(ctx, ids, false); err != nil {
			return specdec.Costs{}, err
		}
	}
	pos := sessions[0].pos
	rows := make([][]float32, b)
	bufs := make([]float32, b*maxN*v)
	for i := range rows {
		rows[i] = bufs[i*maxN*v : (i+1)*maxN*v]
	}
	// pass runs n rows for every session, then rolls them back.
	pass := func(n int) (float64, error) {
		ids = ids[:0]
		for i := range sessions {
			for j := range n {
				ids = append(ids, int32((i*17+j*5+11)%v))
			}
			cu[i+1] = int32(len(ids))
		}
		var out [][]float32
		if n > 1 {
			out = rows
		}
		start := time.Now()
		err := bt.run(ctx, sessions, cu, ids, nil, out)
		t := float64(time.Since(start))
		if err != nil {
			return 0, err
		}
		for _, s := range sessions { // untimed
			ok, err := s.rollback(pos)
			if err == nil && !ok {
				err = s.Truncate(ctx, pos)
			}
			if err != nil {
				return 0, fmt.Errorf("k3: measuring speculation costs: %w", err)
			}
		}
		return t, nil
	}
	times := make([][]float64, maxN+1)
	for r := 0; r <= 3; r++ { // round 0 warms up
		for n := 1; n <= maxN; n++ {
			t, err := pass(n)
			if err != nil {
				return specdec.Costs{}, err
			}
			if r > 0 {
				times[n] = append(times[n], t)
			}
		}
	}
	step := medianOf(times[1])
	c := specdec.Costs{Pass: make([]float64, maxN+1), Rollback: lone.Rollback, Step: step / 1e9}
	for n := 1; n <= maxN; n++ {
		c.Pass[n] = medianOf(times[n]) / step
	}
	if m.specBatch == nil {
		m.specBatch = map[int]specdec.Costs{}
	}
	m.specBatch[b] = c
	return c, nil
}

// measuredCosts returns the costs measured so far nearest a batch of
// batch sequences: the largest batch measured that is not larger, else a
// lone session's; zero Costs when nothing was measured.
func (m *Model) measuredCosts(batch int) specdec.Costs {
	m.specMu.Lock()
	defer m.specMu.Unlock()
	c, near := m.specCosts, 1
	for b, bc := range m.specBatch {
		if b <= batch && b > near {
			c, near = bc, b
		}
	}
	return c
}

func medianOf(v []float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[len(v)/2]
}

// confidencer is a drafter that scores each position of the block it last
// drafted (DSpark's confidence head): the probability that the draft is
// accepted given that the ones before it were.
type confidencer interface {
	blockConfidences() []float32
}

// speculation is a generation's drafts in flight: tokens the session
// already holds past the last token drawn, with the logits after each.
type speculation struct {
	drafter specdec.Drafter
	depth   int
	drafts  []int32   // fed, not yet confirmed by a draw
	rows    []float32 // rows[i*vocab:]: the logits after drafts[i]
	next    int       // drafts[:next] are confirmed
	hist    []int32   // the history handed to the drafter (the session's tokens and id)
	pass    []int32   // scratch: the verify pass's tokens
	out     []float32 // scratch: the verify pass's logits

	// WithAdaptiveSpeculation: the depth is chosen per pass from acc and
	// costs; a plain step keeps the drafter's next token as probe, to
	// compare with the next draw.
	adaptive bool
	acc      specdec.Acceptance
	costs    specdec.Costs
	// batch is how many sequences decode beside this one (set by the
	// Batcher each round; 0 or 1 alone), costsBatch the batch costs were
	// sought for (sought: they were; costs may still be zero, when no
	// room was left to measure them and nothing had been).
	batch, costsBatch int
	sought            bool
	// passRows bounds a verify pass's rows where a Batcher runs it (its
	// pass's row limit, the token budget); 0 alone, where depth does.
	passRows int
	probe    int32
	hasProbe bool
	// draftSec is the drafter's time per token asked for (seconds, a
	// moving average), which the adaptive depth adds to a pass's cost.
	draftSec float64
	drafted  bool // the drafter has been called once
	lastHist int  // len(hist) at the drafter's last call
	// sinceProbe counts the plain steps since the last probe; probeSec is
	// a probe call's whole time (seconds, a moving average), including the
	// drafter catching up on the tokens since its last call, which
	// draftSec leaves out.
	sinceProbe int
	probeSec   float64

	// WithRejectionSampling: picked are the tokens pickDraft drew for the
	// current block (none for a drafter without distributions), q[i*vocab:]
	// the distribution picked[i] was drawn from, pick the generation's
	// pickDraft.
	rejection bool
	q         []float64
	picked    []int32
	pick      func([]float32) int32
	// A probe drawn from q is scored by its exact acceptance probability
	// Σ min(p, q) (probeRate, from p in probeP) rather than by whether
	// the plain draw happened to equal it, which has mean Σ p·q.
	probeRate    float64
	hasProbeRate bool
	probeP       []float64
}

// probeShare bounds what the probes of a costly drafter take of plain
// decoding (the adaptive depth must not be more than a few percent slower
// than plain decoding when speculation does not pay).
const probeShare = 0.01

// checkSpeculation reports whether the model can run o's speculation.
func (m *Model) checkSpeculation(o *genOptions) error {
	if o.drafter == nil {
		return nil
	}
	if m.rollback < o.depth {
		return fmt.Errorf("%w: speculation %d deep rolls back through the replay logs: load the model WithRollback(%d) or more (it has %d)", ErrInvalidOption, o.depth, o.depth, m.rollback)
	}
	return nil
}

// feed gives the session the token just drawn (done: the generation's
// last) in a pass of its own, the pass feedPass says.
func (g *generation) feed(ctx context.Context, id int32, done bool) error {
	pass, err := g.feedPass(ctx, id, done)
	if err != nil || pass == nil {
		return err
	}
	s := g.s
	if len(pass) == 1 {
		_, err := s.run(ctx, pass, false)
		return err
	}
	if err := s.runInto(ctx, pass, g.spec.out); err != nil {
		g.spec.drafts = g.spec.drafts[:0]
		return err
	}
	g.landed()
	return nil
}

// feedPass says which tokens a pass must feed after the draw id: without
// speculation id alone, a decode step. With it, a draw equal to the next
// draft is already in the session and its row becomes the next logits: no
// pass (nil). Otherwise the drafts still in flight are dropped, and id
// goes in with new drafts in one exact pass, after which landed takes the
// rows. The slice is valid until the next call.
func (g *generation) feedPass(ctx context.Context, id int32, done bool) ([]int32, error) {
	s, sp := g.s, g.spec
	g.one[0] = id
	if sp == nil {
		return g.one[:], nil
	}
	v := s.m.Config.VocabSize
	if sp.next < len(sp.drafts) {
		if sp.drafts[sp.next] == id {
			copy(s.last, sp.rows[sp.next*v:(sp.next+1)*v])
			sp.next++
			if done {
				return nil, g.settle()
			}
			if sp.next == len(sp.drafts) {
				sp.drafts, sp.next = sp.drafts[:0], 0 // the next draw is the bonus token
			}
			return nil, nil
		}
		if err := g.settle(); err != nil {
			return nil, err
		}
	}
	if done {
		return g.one[:], nil
	}
	return g.draftPass(ctx, id)
}

// drew records a draw against the drafts: the acceptance estimate learns
// whether the next draft (or the probe of a plain step) was right, and
// the usage counts a confirmed draft, before the draw's token can carry
// the generation's last Usage.
func (sp *speculation) drew(id int32, u *Usage) {
	if sp.hasProbe {
		if sp.hasProbeRate {
			sp.acc.ObserveRate(sp.probeRate)
		} else {
			sp.acc.Observe(sp.probe == id)
		}
		sp.hasProbe, sp.hasProbeRate = false, false
	}
	if sp.next < len(sp.drafts) {
		ok := sp.drafts[sp.next] == id
		sp.acc.Observe(ok)
		if ok {
			u.AcceptedTokens++
		}
	}
}

// draftPass returns the tokens of the pass that feeds id, the token just
// drawn: id alone, or id and the drafts after it (then sp.out has room
// for their logits, which landed takes once the pass has run).
func (g *generation) draftPass(ctx context.Context, id int32) ([]int32, error) {
	s, sp := g.s, g.spec
	v := s.m.Config.VocabSize
	n := min(sp.depth, s.limit-s.pos-1, g.o.maxTokens-g.n)
	if sp.passRows > 0 {
		n = min(n, sp.passRows-1)
	}
	sp.drafts, sp.next = sp.drafts[:0], 0
	probe, confident := false, false
	if sp.adaptive && n > 0 && (!sp.sought || sp.costsBatch != sp.batch) {
		c, err := s.m.SpeculationCostsAt(ctx, sp.batch)
		if errors.Is(err, ErrMemoryBudget) {
			// The measurement's scratch sessions do not fit the budget
			// beside the sequences that hold it: the depth goes by what
			// was measured before (a smaller batch, a lone session) or,
			// with nothing, the generation decodes plainly, and looks
			// again when the batch changes.
			c, err = s.m.measuredCosts(sp.batch), nil
		}
		if err != nil {
			return nil, err
		}
		sp.costs, sp.costsBatch, sp.sought = c, sp.batch, true
	}
	if sp.adaptive && sp.costs.Pass == nil {
		n = 0
	}
	if sp.adaptive && n > 0 {
		c := sp.costs
		if c.Step > 0 {
			// The batch's drafters run one after another between passes.
			c.Draft = sp.draftSec * float64(max(sp.batch, 1)) / c.Step
		}
		// A drafter with confidences (DSpark) drafts its whole block in
		// one pass and says how sure it is of each position: the
		// acceptance so far decides whether to draft, pricing the whole
		// block at any depth, and its confidences how much of the block to
		// verify (below).
		_, block := sp.drafter.(confidencer)
		if block {
			c.Block, c.Draft = float64(n)*c.Draft, 0
		}
		if k := specdec.BestDepth(sp.acc.Lower(), n, c); k > 0 {
			if confident = block; !confident {
				n = k
			}
		} else if specdec.BestDepth(1, n, c) > 0 {
			// A probe drafts one token to keep the acceptance estimate
			// current; a drafter whose drafts cost time probes only every
			// so many steps, so that probing costs at most probeShare of
			// plain decoding.
			n, probe = 1, true
			cost := c.Draft + c.Block
			if sp.probeSec > 0 && c.Step > 0 {
				cost = max(cost, sp.probeSec*float64(max(sp.batch, 1))/c.Step)
			}
			if every := int(cost / probeShare); sp.sinceProbe < every {
				n, probe = 0, false
				sp.sinceProbe++
			} else {
				sp.sinceProbe = 0
			}
		} else {
			// Not even drafts that are always right would pay for what
			// they cost to draft: no probe either.
			n = 0
		}
	}
	if n > 0 {
		// The history handed out last time (the tokens then, and the token
		// fed after them) is a prefix of the session's tokens now: every
		// change since went through feed, which rolls back no further than
		// the tokens drawn. So it grows by the new tokens alone, not a copy
		// of the whole context per pass.
		if h := len(sp.hist); h <= len(s.tokens) {
			sp.hist = append(sp.hist, s.tokens[h:]...)
		} else {
			sp.hist = append(sp.hist[:0], s.tokens...)
		}
		sp.hist = append(sp.hist, id)
		start := time.Now()
		if sm, ok := sp.drafter.(specdec.Sampler); ok && sp.rejection {
			sp.picked = sp.picked[:0]
			// The constraint's mask is that of the position just drawn,
			// not of the drafts': they are drawn from the drafter's own
			// distribution, which the verifying draws hold to the mask of
			// each position (exact for any proposal distribution).
			g.sampler.SetMask(nil)
			sp.drafts = sm.SampleDraft(sp.hist, n, sp.drafts, sp.pick)
			g.sampler.SetMask(g.mask)
			// The drafts' penalties counted each pick as it was drawn;
			// the draws that confirm the drafts count them again.
			g.sampler.Forget(sp.picked...)
			if len(sp.drafts) > len(sp.picked) || !slices.Equal(sp.drafts, sp.picked[:len(sp.drafts)]) {
				sp.drafts = sp.drafts[:0]
				return nil, fmt.Errorf("k3: the drafter's drafts are not the tokens it picked (specdec.Sampler)")
			}
		} else {
			sp.picked = sp.picked[:0]
			sp.drafts = sp.drafter.Draft(sp.hist, n, sp.drafts)
		}
		// A drafter that runs a model spends a call after a gap (the
		// first, after the prompt, or a probe after plain steps) catching
		// up on the tokens since its last call; only calls that follow
		// the last by at most one verify run's tokens time the drafting.
		if probe {
			if whole := time.Since(start).Seconds(); sp.probeSec == 0 {
				sp.probeSec = whole
			} else {
				sp.probeSec = 0.7*sp.probeSec + 0.3*whole
			}
		}
		grew := len(sp.hist) - sp.lastHist
		sp.lastHist = len(sp.hist)
		if d := time.Since(start).Seconds() / float64(n); !sp.drafted || grew > sp.depth+1 {
			sp.drafted = true
		} else if sp.draftSec == 0 {
			sp.draftSec = d
		} else {
			sp.draftSec = 0.9*sp.draftSec + 0.1*d
		}
		sp.drafts = sp.drafts[:min(len(sp.drafts), n)]
		// Drafts past the first the grammar forbids cannot be confirmed:
		// they are not verified.
		if a, ok := g.con.(interface{ admits([]int32) int }); ok {
			sp.drafts = sp.drafts[:a.admits(sp.drafts)]
		}
	}
	if confident {
		conf := sp.drafter.(confidencer).blockConfidences()
		k := specdec.BestPrefix(conf[:min(len(conf), len(sp.drafts))], sp.costs)
		sp.drafts, probe = sp.drafts[:max(k, min(1, len(sp.drafts)))], k == 0
	}
	if probe && len(sp.drafts) > 0 {
		// Plain decoding; the draft only feeds the estimate.
		sp.probe, sp.hasProbe = sp.drafts[0], true
		sp.drafts = sp.drafts[:0]
	}
	for _, d := range sp.drafts {
		if d < 0 || int(d) >= v {
			sp.drafts = sp.drafts[:0]
			return nil, fmt.Errorf("k3: the drafter proposed token %d outside the vocabulary (%d)", d, v)
		}
	}
	sp.pass = append(append(sp.pass[:0], id), sp.drafts...)
	if len(sp.drafts) > 0 {
		g.usage.DraftTokens += len(sp.drafts)
		sp.out = grow(sp.out, len(sp.pass)*v)
	}
	return sp.pass, nil
}

// pickDraft draws a draft from a drafter's logits for WithRejectionSampling,
// keeping its distribution for the draw that verifies it.
func (g *generation) pickDraft(logits []float32) int32 {
	sp := g.spec
	v := g.s.m.Config.VocabSize
	k := len(sp.picked)
	if len(logits) != v || k >= sp.depth {
		return -1
	}
	if len(sp.q) < sp.depth*v {
		sp.q = make([]float64, sp.depth*v)
	}
	id, err := g.sampler.Draft(logits, sp.q[k*v:(k+1)*v])
	if err != nil {
		return -1 // nothing to draw from: draft no further
	}
	sp.picked = append(sp.picked, id)
	return id
}

// draw draws the next token from the session's last logits: a plain draw,
// or, for WithRejectionSampling, the verification of the draft in flight
// at that position.
func (g *generation) draw() (int32, error) {
	sp := g.spec
	if sp != nil && sp.rejection && sp.hasProbe && len(sp.picked) > 0 {
		v := g.s.m.Config.VocabSize
		if len(sp.probeP) < v {
			sp.probeP = make([]float64, v)
		}
		if err := g.sampler.Probs(g.s.last, sp.probeP[:v]); err == nil {
			var r float64
			for i, p := range sp.probeP[:v] {
				r += min(p, sp.q[i])
			}
			sp.probeRate, sp.hasProbeRate = r, true
		}
	}
	if sp == nil || !sp.rejection || sp.next >= len(sp.drafts) {
		return g.sampler.Sample(g.s.last)
	}
	var q []float64
	if len(sp.picked) > 0 {
		v := g.s.m.Config.VocabSize
		q = sp.q[sp.next*v : (sp.next+1)*v]
	}
	return g.sampler.Verify(g.s.last, q, sp.drafts[sp.next])
}

// landed takes a verify pass's logits from sp.out: the first row becomes
// the session's next-token logits, the others wait in sp.rows for the
// draws that may confirm their drafts.
func (g *generation) landed() {
	s, sp := g.s, g.spec
	v := s.m.Config.VocabSize
	copy(s.last, sp.out[:v])
	sp.rows = sp.out[v : len(sp.pass)*v]
}

// settle drops the drafts the generation has not confirmed, so that the
// session holds exactly the tokens drawn and fed: the KDA states come back
// from the replay logs and the caches truncate in place; the logits the
// session keeps are the row the last draw read.
func (g *generation) settle() error {
	s, sp := g.s, g.spec
	if sp == nil || sp.next >= len(sp.drafts) {
		if sp != nil {
			sp.drafts, sp.next = sp.drafts[:0], 0
		}
		return nil
	}
	keep := s.pos - (len(sp.drafts) - sp.next)
	sp.drafts, sp.next = sp.drafts[:0], 0
	if gs := s.group; gs != nil {
		return gs.rollbackTo(keep) // a GroupBatcher's generation: every rank drops them
	}
	last := s.last
	ok, err := s.rollback(keep)
	if err != nil {
		s.broken = err
		return err
	}
	if !ok {
		// The logs always reach a pass back (checkSpeculation); Truncate
		// is the slow, still exact, way if they ever do not.
		return s.Truncate(context.Background(), keep)
	}
	s.last = last
	s.charge()
	return nil
}
