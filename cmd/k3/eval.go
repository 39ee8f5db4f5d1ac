package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"

	"k3/k3"
)

func runEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("eval", flag.ContinueOnError)
	model := fs.String("model", "", "checkpoint directory (default: the embedded model)")
	window := fs.Int("window", 2048, "tokens scored per fresh sequence: a longer file is scored in windows, each from an empty state after the BOS token")
	verbose := fs.Bool("v", false, "print every file's figures")
	backend := addBackendFlags(fs)
	synopsis := "eval [-model DIR] [-window N] [-backend NAME] FILE...\n\n" +
		"Scores files with the model: the cross-entropy of each file's tokens, each predicted from the tokens\n" +
		"before it in its window. Ends with the line 'N tokens, X bits/token, Y bits/byte'."
	if err := parseFlags(fs, synopsis, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fmt.Fprintln(stderr, "k3 eval: no files to score")
		fs.Usage()
		return errUsage
	}
	var m *k3.Model
	var err error
	if *model == "" {
		m, err = k3.LoadTiny(ctx, backend.loadOptions()...)
	} else {
		m, err = k3.Load(ctx, *model, backend.loadOptions()...)
	}
	if err != nil {
		return err
	}
	defer m.Close()
	if *window < 1 || *window >= m.ContextLength() {
		return fmt.Errorf("-window %d: want 1..%d (the model's context is %d positions, one of them the BOS token)", *window, m.ContextLength()-1, m.ContextLength())
	}
	var total score
	for _, name := range fs.Args() {
		text, err := os.ReadFile(name)
		if err != nil {
			return err
		}
		s, err := scoreText(ctx, m, string(text), *window)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if *verbose {
			fmt.Fprintf(stdout, "%s: %s\n", name, s)
		}
		total.add(s)
	}
	if total.Tokens == 0 {
		// No prediction was made: 0 bits/token would read as a perfect score.
		return errors.New("nothing to score: the files hold no text")
	}
	fmt.Fprintln(stdout, total)
	return nil
}

// score is the cross-entropy of some text under a model.
type score struct {
	Bits   float64 // -sum log2 p(token)
	Tokens int
	Bytes  int
}

func (s *score) add(o score) { s.Bits += o.Bits; s.Tokens += o.Tokens; s.Bytes += o.Bytes }

func (s score) String() string {
	if s.Tokens == 0 {
		return "empty: nothing to score"
	}
	perTok, perByte := s.Bits/float64(s.Tokens), s.Bits/float64(s.Bytes)
	return fmt.Sprintf("%d tokens, %.4f bits/token, %.4f bits/byte", s.Tokens, perTok, perByte)
}

// scoreText tokenizes text as plain text (special-token strings are not
// special here) and scores every token, window tokens at a time: each
// window is a fresh sequence [BOS, t_0 .. t_{n-2}] whose logits predict
// t_0 .. t_{n-1}.
func scoreText(ctx context.Context, m *k3.Model, text string, window int) (score, error) {
	bos := int32(m.Config.BOSTokenID) // config.Parse keeps it inside the vocabulary
	ids := m.Tokenizer().Encode(text, false)
	sc := score{Tokens: len(ids), Bytes: len(text)}
	v := m.VocabSize()
	in := make([]int32, 0, window)
	for a := 0; a < len(ids); a += window {
		w := ids[a:min(a+window, len(ids))]
		in = append(append(in[:0], bos), w[:len(w)-1]...)
		s, err := m.NewSession()
		if err != nil {
			return score{}, err
		}
		logits, err := s.Forward(ctx, in)
		s.Close()
		if err != nil {
			return score{}, err
		}
		for i, id := range w {
			sc.Bits -= logProb(logits[i*v:(i+1)*v], id) / math.Ln2
		}
	}
	return sc, nil
}

// logProb is log softmax(logits)[id], in float64.
func logProb(logits []float32, id int32) float64 {
	mx := math.Inf(-1)
	for _, x := range logits {
		mx = max(mx, float64(x))
	}
	var sum float64
	for _, x := range logits {
		sum += math.Exp(float64(x) - mx)
	}
	return float64(logits[id]) - mx - math.Log(sum)
}
