// Package plan estimates how a model deploys over accelerator cards: for
// each way of splitting it (tensor, context and data parallel attention,
// expert parallel MoE), the memory each card holds, the bytes its
// collectives move per decoded token, and a roofline latency and
// throughput for decode and prefill. It is arithmetic over the config and
// the card's published limits, for `k3 plan`; docs/bench compares it with
// published deployments.
package plan

import (
	"fmt"
	"math"
	"sort"

	"k3/config"
)

// Card is one accelerator's limits.
type Card struct {
	Name      string
	MemoryGB  float64 // device memory
	TFLOPS    float64 // dense matrix peak at the weights' dtype
	MemGBps   float64 // device memory bandwidth
	LinkGBps  float64 // collective bandwidth per card, one direction
	LatencyUs float64 // fixed cost of one collective
}

// Cards are presets from published specifications (docs/bench, "Deployment
// planner", says where each figure comes from).
var Cards = map[string]Card{
	// One die of an Ascend 910C (an A3 NPU device): half of the chip's
	// 780 TFLOPS BF16, 128 GB and 3.2 TB/s, and of its 784 GB/s of
	// interconnect (both directions).
	"a3":      {Name: "a3", MemoryGB: 64, TFLOPS: 390, MemGBps: 1600, LinkGBps: 196, LatencyUs: 10},
	"a3-int8": {Name: "a3-int8", MemoryGB: 64, TFLOPS: 780, MemGBps: 1600, LinkGBps: 196, LatencyUs: 10},
}

// Workload is what the cards serve.
type Workload struct {
	Context     int     // tokens each decoding sequence attends over
	Batch       int     // sequences decoding at once over all cards
	Prompt      int     // tokens of a prompt, for the prefill estimate
	WeightBytes float64 // bytes per parameter (2 bf16, 1 int8 or fp8)
	KVBytes     float64 // bytes per cached element (2 bf16, 1 int8)
	ActBytes    float64 // bytes per activation element moved by collectives
	// Drafts tokens are verified per sequence and step, of which Accepted
	// are kept on average (multi-token prediction); 0 and 0 without.
	Drafts   int
	Accepted float64
	// SplitIndexer splits the Lightning Indexer's heads over TP as well
	// (k3.Layout.SplitIndexer): its query and head-weight projections and
	// its scoring fall by TP, and each query row's fp32 scores over the
	// card's keys are all-reduced per DSA layer.
	SplitIndexer bool
}

// Layout is one way to split the model over Cards = TP·CP·DP cards: the
// attention is tensor parallel over heads (TP), context parallel over
// positions (CP) and data parallel over sequences (DP); the routed experts
// spread over EP cards, each expert's columns over Cards/EP of them.
type Layout struct {
	TP, CP, DP, EP int
}

func (l Layout) String() string { return fmt.Sprintf("TP%d CP%d DP%d EP%d", l.TP, l.CP, l.DP, l.EP) }

// Estimate is a layout's figures per card.
type Estimate struct {
	Layout
	WeightsGB   float64 // weights each card holds
	StateGB     float64 // KV caches and KDA states of the card's sequences
	Fits        bool    // weights and state fit the card's memory
	CommMB      float64 // bytes the card's collectives send per decode step
	CPCommMB    float64 // of CommMB, context parallelism's (partial outputs, top-K candidates)
	ComputeMs   float64 // decode step: the card's products at its peak
	MemoryMs    float64 // decode step: the card's weight and cache reads at its bandwidth
	CommMs      float64 // decode step: the collectives at the link's bandwidth and latency
	TPOTMs      float64 // time per output token: (max(compute, memory) + comm) / tokens kept per step
	TokPerCardS float64 // decode throughput per card
	TTFTMs      float64 // a prompt's prefill on all the cards: products at peak plus collectives
}

// counts are the parameters and per-token costs the estimate needs.
type counts struct {
	attn, indexer, dense, routed, shared, embed, head float64 // parameters
	indexerHeads                                      float64 // of indexer, the per-head projections (wq_b, weights_proj)
	expertParams                                      float64 // one routed expert
	routedLayers                                      int
	mlaLayers, dsaLayers, kdaLayers                   int
	kvPerPos, idxPerPos                               float64 // cached elements per position per layer
	kdaState                                          float64 // elements per sequence per KDA layer (fp32)
}

func count(c *config.Config) counts {
	var n counts
	d := float64(c.HiddenSize)
	n.embed = float64(c.VocabSize) * d
	if !c.TieWordEmbeddings {
		n.head = n.embed
	}
	for l, kind := range c.Layers {
		switch kind {
		case config.KDA:
			k := c.KDA
			hd := float64(k.NumHeads * k.HeadDim)
			dk := float64(k.HeadDim)
			n.attn += 4*hd*d + dk*d + hd*dk + float64(k.NumHeads)*d // q, k, v, o; f_a, f_b; b
			if k.FullRankGate {
				n.attn += hd * d
			} else {
				n.attn += dk*d + hd*dk
			}
			n.kdaLayers++
			n.kdaState = float64(k.NumHeads*k.HeadDim*k.HeadDim) + 3*hd*float64(k.ConvKernel-1)
		default:
			m := c.MLA
			h := float64(m.NumHeads)
			qin := d
			if m.QLoRARank > 0 {
				qin = float64(m.QLoRARank)
				n.attn += qin * d
			}
			n.attn += h*float64(m.QKNopeHeadDim+m.QKRopeHeadDim)*qin + float64(m.KVLoRARank+m.QKRopeHeadDim)*d +
				h*float64(m.QKNopeHeadDim+m.VHeadDim)*float64(m.KVLoRARank) + d*h*float64(m.VHeadDim)
			if m.OutputGate {
				n.attn += h * float64(m.VHeadDim) * d
			}
			n.kvPerPos = float64(m.KVLoRARank + m.QKRopeHeadDim)
			if kind == config.DSA && c.Indexer != nil {
				ix := c.Indexer
				heads := float64(ix.NumHeads*ix.HeadDim)*qin + float64(ix.NumHeads)*d
				n.indexer += heads + float64(ix.HeadDim)*d
				n.indexerHeads += heads
				n.idxPerPos = float64(ix.HeadDim)
				n.dsaLayers++
			} else {
				n.mlaLayers++
			}
		}
		if c.IsMoELayer(l) {
			m := c.MoE
			in := d
			if m.LatentSize > 0 {
				in = float64(m.LatentSize)
				n.shared += 2 * in * d // the latent projections run for every token
			}
			n.expertParams = 3 * in * float64(m.IntermediateSize)
			n.routed += float64(m.NumExperts) * n.expertParams
			n.shared += 3*d*float64(m.IntermediateSize*m.NumShared) + float64(m.NumExperts)*d
			n.routedLayers++
		} else {
			n.dense += 3 * d * float64(c.IntermediateSize)
		}
	}
	return n
}

// Layouts lists the layouts of cards cards: TP, CP and DP divisors of
// cards whose product is cards, TP no larger than the attention heads of
// any layer kind (k3 gives a TP rank beyond them a duplicate head, which
// computes for nothing and which the estimate's per-card shares do not
// model), EP a divisor of cards no larger than the expert count.
func Layouts(c *config.Config, cards int) []Layout {
	var divs []int
	for d := 1; d <= cards; d++ {
		if cards%d == 0 {
			divs = append(divs, d)
		}
	}
	experts := 1
	if c.MoE != nil {
		experts = c.MoE.NumExperts
	}
	heads := cards
	for _, kind := range c.Layers {
		if kind == config.KDA {
			heads = min(heads, c.KDA.NumHeads)
		} else {
			heads = min(heads, c.MLA.NumHeads)
		}
	}
	var out []Layout
	for _, tp := range divs {
		if tp > heads {
			continue
		}
		for _, cp := range divs {
			if cards%(tp*cp) != 0 {
				continue
			}
			dp := cards / (tp * cp)
			for _, ep := range divs {
				if ep <= experts && (c.MoE != nil || ep == 1) {
					out = append(out, Layout{TP: tp, CP: cp, DP: dp, EP: ep})
				}
			}
		}
	}
	return out
}

// Estimate computes one layout's figures.
func (n counts) estimate(c *config.Config, card Card, cards int, w Workload, l Layout) Estimate {
	e := Estimate{Layout: l}
	d := float64(c.HiddenSize)
	tp, cp, dp, ep := float64(l.TP), float64(l.CP), float64(l.DP), float64(l.EP)
	ncards := float64(cards)
	// Weights: attention, dense MLP, shared experts, embedding and lm_head
	// split over TP (replicated over CP and DP); the indexer replicated
	// (it sums over its heads before the top-k); routed experts over all
	// cards.
	indexer, scoring := n.indexer, 1.0 // a card's indexer parameters, and its share of the scoring
	splitIx := w.SplitIndexer && l.TP > 1 && n.dsaLayers > 0
	if splitIx {
		indexer, scoring = n.indexer-n.indexerHeads*(1-1/tp), 1/tp
	}
	weights := (n.attn+n.dense+n.shared+n.embed+n.head)/tp + indexer + n.routed/ncards
	e.WeightsGB = weights * w.WeightBytes / 1e9
	// State: each DP group holds Batch/DP sequences; a card holds their
	// latent and index keys for its CP share of the positions (the latent
	// is replicated over TP: every head reads it) and its TP share of the
	// KDA heads' states.
	seqs := float64(w.Batch) / dp
	L := float64(w.Context)
	kvSeq := L / cp * (n.kvPerPos*float64(n.mlaLayers+n.dsaLayers)*w.KVBytes + n.idxPerPos*float64(n.dsaLayers)*w.KVBytes)
	kdaSeq := n.kdaState * float64(n.kdaLayers) * 4 / tp
	e.StateGB = seqs * (kvSeq + kdaSeq) / 1e9
	e.Fits = e.WeightsGB+e.StateGB <= card.MemoryGB
	// Decode step: q = 1 + Drafts tokens per sequence.
	q := 1 + float64(w.Drafts)
	tokens := seqs * q // rows in this card's attention per step
	allTokens := float64(w.Batch) * q
	k := 0.0
	if c.MoE != nil {
		k = float64(c.MoE.TopK)
	}
	topK := L
	if c.Indexer != nil {
		topK = math.Min(float64(c.Indexer.TopK), L)
	}
	// Products (2 flops per multiply-add) on this card.
	flops := 2 * tokens * ((n.attn+n.dense+n.shared+n.head)/tp + indexer)
	flops += 2 * allTokens * k * n.expertParams * float64(n.routedLayers) / ncards
	if m := c.MLA; n.mlaLayers+n.dsaLayers > 0 {
		// Absorbed MQA: scores over dc+dr and values over dc per head.
		perPos := 2 * float64(m.NumHeads) / tp * float64(2*m.KVLoRARank+m.QKRopeHeadDim)
		flops += tokens * perPos * (float64(n.dsaLayers)*topK/cp + float64(n.mlaLayers)*L/cp)
	}
	if ix := c.Indexer; ix != nil {
		flops += tokens * 2 * float64(ix.NumHeads*ix.HeadDim) * L / cp * float64(n.dsaLayers) * scoring
	}
	e.ComputeMs = flops / (card.TFLOPS * 1e12) * 1e3
	// Reads: every weight the card holds that the step touches (routed
	// experts hit by at least one of the step's tokens), then the caches.
	hit := 1.0
	if c.MoE != nil {
		hit = 1 - math.Pow(1-1/float64(c.MoE.NumExperts), allTokens*k)
	}
	bytes := ((n.attn+n.dense+n.shared+n.head)/tp + indexer + n.routed/ncards*hit) * w.WeightBytes
	bytes += seqs * L / cp * n.idxPerPos * float64(n.dsaLayers) * w.KVBytes // the indexer scans every key
	bytes += tokens * topK / cp * n.kvPerPos * float64(n.dsaLayers) * w.KVBytes
	bytes += seqs * L / cp * n.kvPerPos * float64(n.mlaLayers) * w.KVBytes
	bytes += seqs * 2 * kdaSeq // read and write the states
	e.MemoryMs = bytes / (card.MemGBps * 1e9) * 1e3
	// Collectives per step: TP all-reduces after each mixer and MLP
	// (ring: 2(TP-1)/TP of the rows); MoE dispatch and combine to the
	// experts' cards (all-to-all of k rows per token, the share that
	// leaves the card); CP: partial attention outputs and top-K
	// candidates (below).
	layers := float64(len(c.Layers))
	comm := 0.0
	calls := 0.0
	ring := func(n float64) float64 { return 2 * (n - 1) / n } // an all-reduce's share of its tensor, per card
	if l.TP > 1 {
		comm += 2 * layers * tokens * d * w.ActBytes * ring(tp)
		// Vocabulary parallelism: the embedding rows add up by an
		// all-reduce, and the cards all-gather their slices of the logits.
		comm += tokens * (d*ring(tp) + float64(c.VocabSize)/tp*(tp-1)) * w.ActBytes
		calls += 2*layers + 2
	}
	if splitIx {
		// The split indexer's scores (fp32: their sum decides a top-K)
		// over the card's keys, all-reduced over TP per DSA layer.
		comm += float64(n.dsaLayers) * tokens * L / cp * 4 * ring(tp)
		calls += float64(n.dsaLayers)
	}
	replicated := l.DP == 1 && l.CP == 1 // every card holds every token
	if c.MoE != nil && replicated && ncards > 1 {
		// Every card has every token, so no dispatch: each computes its
		// experts' (or columns') share for all of them and one all-reduce
		// over all the cards adds the shares (k3's Group): in place of the
		// TP all-reduce after the MoE, plus the routed latent rows first
		// for a latent MoE.
		moeLayers := float64(n.routedLayers)
		width := d
		if m := c.MoE; m.LatentSize > 0 {
			width += float64(m.LatentSize)
		}
		comm -= moeLayers * tokens * d * w.ActBytes * ring(tp)
		comm += moeLayers * tokens * width * w.ActBytes * ring(ncards)
		calls += moeLayers
	} else if c.MoE != nil {
		moeLayers := float64(n.routedLayers)
		if l.EP > 1 {
			// Each TP rank dispatches its share of the rows.
			comm += moeLayers * 2 * tokens / tp * k * d * w.ActBytes * (ep - 1) / ep
			calls += 2 * moeLayers
		}
		if etp := ncards / ep; etp > 1 {
			// The cards sharing an expert-parallel index split each
			// expert's columns: they all-gather the rows routed to them
			// and reduce-scatter the results.
			comm += moeLayers * 2 * (etp - 1) * allTokens * k / ncards * d * w.ActBytes
			calls += 2 * moeLayers
		}
	}
	if l.CP > 1 {
		// k3's context-parallel decode: every CP rank attends over the
		// keys it holds and the ranks all-gather the partial outputs
		// (lifted to the value heads, with each head's log-sum-exp); DSA layers
		// first send each rank's top-K candidates (score and position) to
		// the others. No keys travel.
		m := c.MLA
		partial := (cp - 1) * float64(m.NumHeads) / tp * float64(m.VHeadDim+1) * w.ActBytes
		cpComm := 0.0
		if n.dsaLayers > 0 {
			cpComm += float64(n.dsaLayers) * tokens * ((cp-1)*topK*8 + partial)
			calls += 2 * float64(n.dsaLayers)
		}
		if n.mlaLayers > 0 {
			cpComm += float64(n.mlaLayers) * tokens * partial
			calls += float64(n.mlaLayers)
		}
		comm += cpComm
		e.CPCommMB = cpComm / 1e6
	}
	e.CommMB = comm / 1e6
	e.CommMs = comm/(card.LinkGBps*1e9)*1e3 + calls*card.LatencyUs/1e3
	kept := 1 + w.Accepted
	e.TPOTMs = (math.Max(e.ComputeMs, e.MemoryMs) + e.CommMs) / kept
	e.TokPerCardS = float64(w.Batch) / (e.TPOTMs / 1e3) / ncards
	// Prefill of one prompt over all the cards: its products at peak (the
	// indexer and attention at the prompt's mean position), plus a TP
	// all-reduce pair per layer.
	p := float64(w.Prompt)
	pf := 2 * p * (n.attn + n.indexer + n.dense + n.shared + n.head + k*n.expertParams*float64(n.routedLayers))
	if m := c.MLA; n.mlaLayers+n.dsaLayers > 0 {
		heads := float64(m.NumHeads)
		// MHA form: q·k over nope+rope, p·v over v, per head and position.
		mha := 2 * heads * float64(m.QKNopeHeadDim+m.QKRopeHeadDim+m.VHeadDim)
		pf += p * mha * (p / 2) * float64(n.mlaLayers)
		if ix := c.Indexer; ix != nil {
			pf += p * (2*float64(ix.NumHeads*ix.HeadDim)*(p/2) + mha*math.Min(float64(ix.TopK), p/2)) * float64(n.dsaLayers)
		}
	}
	e.TTFTMs = pf / (ncards * card.TFLOPS * 1e12) * 1e3
	if l.TP > 1 {
		e.TTFTMs += (2*layers*p/cp/dp*d*w.ActBytes*2*(tp-1)/tp)/(card.LinkGBps*1e9)*1e3 + 2*layers*card.LatencyUs/1e3
	}
	return e
}

// Plan estimates every layout of cards cards, those that fit first, then
// by decode throughput per card.
func Plan(c *config.Config, card Card, cards int, w Workload) ([]Estimate, error) {
	switch {
	case cards < 1:
		return nil, fmt.Errorf("plan: %d cards", cards)
	case card.MemoryGB <= 0 || card.TFLOPS <= 0 || card.MemGBps <= 0 || card.LinkGBps <= 0:
		return nil, fmt.Errorf("plan: card %q needs positive memory, TFLOPS, memory and link bandwidth", card.Name)
	case w.Context < 1 || w.Batch < 1 || w.Prompt < 0:
		return nil, fmt.Errorf("plan: context %d, batch %d, prompt %d", w.Context, w.Batch, w.Prompt)
	case w.WeightBytes <= 0 || w.KVBytes <= 0 || w.ActBytes <= 0:
		return nil, fmt.Errorf("plan: bytes per weight %g, cache element %g, activation %g must be positive", w.WeightBytes, w.KVBytes, w.ActBytes)
	case w.Drafts < 0 || w.Accepted < 0 || w.Accepted > float64(w.Drafts):
		return nil, fmt.Errorf("plan: %g of %d drafts accepted", w.Accepted, w.Drafts)
	}
	n := count(c)
	var out []Estimate
	for _, l := range Layouts(c, cards) {
		if w.Batch%l.DP != 0 {
			continue // every DP group gets whole sequences
		}
		out = append(out, n.estimate(c, card, cards, w, l))
	}
	sort.SliceStable(out, func(i, j int) bool {
		if out[i].Fits != out[j].Fits {
			return out[i].Fits
		}
		return out[i].TokPerCardS > out[j].TokPerCardS
	})
	return out, nil
}
