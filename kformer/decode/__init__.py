"""Decoding: token ids in, translations out.

search.py is the one graph-mode search loop (greedy and beam); translator.py traces it on a
trained model; options.py what a request may choose; sentences.py and text_batches.py turn
paragraphs into batches of sentences and back; runner.py is the interface every runtime
implements (Keras here, the exported formats in kformer.export); gather.py batches work that
arrives a piece at a time.
"""
