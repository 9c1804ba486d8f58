"""Decoding: token ids in, translations out.

search/ holds the graph-mode searches (greedy and beam, their loops); recipe.py how they are built
for each runtime; translator.py traces them on a trained model and runs them (KerasRunner);
options.py what a request may choose; sentences.py and text_batches.py turn
paragraphs into batches of sentences and back; runner.py is the interface every runtime
implements (Keras here, the exported formats in kformer.export); gather.py batches work that
arrives a piece at a time.
"""
