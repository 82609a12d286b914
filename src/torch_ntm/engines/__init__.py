"""How the models compute a sequence: the engines, behind one interface."""
