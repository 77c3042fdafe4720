"""python -m fedagg.pretrain model=NAME dataset=NAME out=FILE [epochs=E lr=LR classes=[...] ...] [run keys ...]

Trains a model centrally on a dataset's training split and writes it as a base file that
`model=NAME model.pretrained=FILE` starts a federated run from. The command line is read at the
Hydra edge (fedagg/edge/pretrain_line.py); the training is fedagg/pretrain/central.py.
"""

from fedagg.edge.pretrain_line import main

if __name__ == "__main__":
    main()
